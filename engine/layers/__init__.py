"""Building blocks of the decoder: RMSNorm, rotary embedding, gated activation."""
