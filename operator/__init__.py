"""pagedkube.operator (torch-free)."""
