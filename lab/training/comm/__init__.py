"""Gradient communication: codecs that turn gradients into the uint8 bytes a collective moves.

See :mod:`lab.training.comm.codecs` for the formats, byte layouts and the non-finite policy.
"""

from lab.training.comm.codecs import CODECS, Codec, Float32Codec, FP8Codec, NVFP4Codec, get_codec

__all__ = ["CODECS", "Codec", "Float32Codec", "FP8Codec", "NVFP4Codec", "get_codec"]
