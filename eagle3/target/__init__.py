"""What the project does with a target's weights: load it for extraction, read single tensors.

Below extraction and training, which both need it. What config must read of a target (its files,
`config.json`, identity) is the leaf `eagle3.target_info`; the chat formats a target speaks are
`eagle3.chat_formats`.

- `decoder`: load the target with transformers and find its decoder layers and final norm;
- `weights`: the embedding, lm_head and final norm read from the checkpoint's safetensors without
  loading the model.
"""
