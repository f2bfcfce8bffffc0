"""Moved to ``pairflow.sites.slurm`` (the Slurm site owns the seam to Slurm); these names
stay importable from here for the Slurm tests and benchmarks, which import them so."""

from __future__ import annotations

from .sites.base import AllocationInfo
from .sites.slurm import allocation, cluster_unavailable, exclusivity, gpu_map, job_details, whole_job

__all__ = ["AllocationInfo", "allocation", "cluster_unavailable", "exclusivity", "gpu_map", "job_details", "whole_job"]
