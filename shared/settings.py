"""The base every role's settings share: CLI flags beat env vars, which beat a TOML file."""

from __future__ import annotations

from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    TomlConfigSettingsSource,
)


class RoleSettings(BaseSettings):
    """Subclasses set ``env_prefix`` and ``toml_file`` in their ``model_config``."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,  # noqa: ARG003 (pydantic-settings passes every source by name)
        file_secret_settings: PydanticBaseSettingsSource,  # noqa: ARG003
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Values passed to the constructor are the CLI's flags.
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls)
