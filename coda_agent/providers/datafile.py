"""Reading the small YAML/JSON files users hand to providers (mock scripts, price overrides)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from ..tasks.loader import yaml_problem
from .base import ProviderConfigError


def read_data_file(path: Path, what: str) -> Any:
    """Parse ``path`` as JSON (``.json``) or YAML; one clear ProviderConfigError naming ``what`` otherwise."""
    try:
        text = path.read_text()
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProviderConfigError(f"cannot read {what} {path}{yaml_problem(exc)}") from exc
    except (OSError, ValueError) as exc:
        raise ProviderConfigError(f"cannot read {what} {path}: {exc}") from exc
