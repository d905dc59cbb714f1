# SPDX-License-Identifier: Apache-2.0
"""The ranks floor: communicators and the one comm resolver, the multi-rank save, shared reads."""
