"""The files tensor-tutor reads and writes: model folders, config.json and the bundled presets (models),
PEFT adapters (adapters), the learner's settings (settings), the data folder and its safe writes (storage,
lock), and the one reader of JSON and TOML that a user, an editor or a disk may have damaged (untrusted).
No torch, no Textual."""
