"""Weight-only quantized weights: the packed formats (formats.py) and the layers that compute with them."""
