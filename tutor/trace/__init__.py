"""Building and running real transformers models: the traced step of `fit --trace` on fake tensors
(memory_trace), the calibration of architectures without a hand profile (arch_calibration, layer_count,
transformers_import), and `time`'s checks against real runs (step_verify on the CPU, device_verify on a
CUDA device, host_costs: a family's own framework code per layer; decode_loops: eager and CUDA-graph decode).

Measurements of the machine alone live in tutor.bench; this package builds models on top of them.
"""
