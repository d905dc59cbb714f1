# SPDX-License-Identifier: Apache-2.0
"""The framework floors: the adapter protocol and GPU helpers, one adapter per framework, the registry."""
