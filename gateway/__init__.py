"""pagedkube.gateway (torch-free)."""
