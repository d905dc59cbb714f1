# SPDX-License-Identifier: Apache-2.0
"""Private front ends of other layouts: Hugging Face/safetensors reads, torch DCP, torch state dicts."""
