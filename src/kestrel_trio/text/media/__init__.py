"""Images and videos for a vision-language model (Qwen3-VL), preprocessed as transformers does.

- :mod:`.images`: an image's bytes to the vision tower's patch rows, and the processor config of a checkpoint.
- :mod:`.video_decode`: a video file's sampled frames decoded with PyAV.
- :mod:`.videos`: frames sampled, resized (:mod:`.frame_resize`, bit for bit torch's bicubic) and cut into
  patch rows.
"""
