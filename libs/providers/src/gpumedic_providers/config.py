"""Which provider a service talks to, from its settings (JSON with a `kind`). The API key is read
from a file, never from the environment or the JSON itself, and never shown."""

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


def open_provider(config: ProviderConfig) -> Provider:
    """The provider the configuration names; ValueError names the key file when it is unusable."""
    try:
        key = config.api_key_file.read_text().strip()
    except OSError as exc:
        raise ValueError(f"provider api_key_file {config.api_key_file}: {exc.strerror or type(exc).__name__}") from None
    if not key:
        raise ValueError(f"provider api_key_file {config.api_key_file} is empty")
    return RunPodProvider(key, image=config.image, base_url=config.base_url, cloud_type=config.cloud_type, timeout_s=config.timeout_s)
