"""The measurement process: probes, the bench suite and torch casts run outside the app's process.

The app (tutor.ui) starts one worker at launch through `tutor.worker.client.WorkerClient`; the worker
(`python -m tutor.worker`) imports torch while the learner reads, runs one job at a time, streams
progress back and is cancelled, killed and restarted without taking the app with it. The app's
process never imports torch. `tutor.worker.proxies` turns the labs' probes into probes that run
there. Nothing here imports Textual; importing this package imports nothing heavy.
"""
