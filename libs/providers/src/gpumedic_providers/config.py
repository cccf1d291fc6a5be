"""Which provider a service talks to, from its settings (JSON with a `kind`). The API key lives in
a file (`api_key_file`), never in the environment or the JSON itself; the service reads it and
never shows it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpumedic_providers.base import Provider
from gpumedic_providers.runpod import BASE_URL, RunPodProvider


class RunPodConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["runpod"]
    api_key_file: Path = Field(description="A file holding the RunPod API key.")
    image: str = Field(min_length=1, max_length=300, description="The worker's container image.")
    base_url: str = Field(default=BASE_URL, pattern=r"^https?://", max_length=300)
    cloud_type: Literal["SECURE", "COMMUNITY", "ALL"] = "SECURE"
    timeout_s: float = Field(default=15.0, gt=0, le=120)


ProviderConfig = RunPodConfig
"""One kind today; a union with a `kind` discriminator when a second provider comes."""


def open_provider(config: ProviderConfig, api_key: str) -> Provider:
    """The provider the configuration names, with the key read from its `api_key_file`."""
    return RunPodProvider(api_key, image=config.image, base_url=config.base_url, cloud_type=config.cloud_type, timeout_s=config.timeout_s)
