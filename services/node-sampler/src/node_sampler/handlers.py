"""The node-sampler consumes nothing yet: it only publishes samples.

Kept so every service has the same file set; a future on-demand "sample now" request would be
handled here.
"""

from __future__ import annotations

HANDLERS: list = []
