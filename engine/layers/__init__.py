"""Building blocks of the decoder.

    rms_norm.py    RMSNorm
    rotary.py      rotary position embedding (with Llama 3 scaling)
    activation.py  SwiGLU's gate over one fused projection
"""
