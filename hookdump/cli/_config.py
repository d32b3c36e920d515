"""`--config FILE.toml`: option values from a file; the command line wins, lists are replaced."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any

import typer

from hookdump.errors import HookdumpError, did_you_mean

CONFIG_META = "hookdump.config"


def load_config(ctx: typer.Context, param: typer.CallbackParam, value: Path | None) -> Path | None:
    """Eager callback: turn the TOML table into the command's defaults (`ctx.default_map`);
    the path is kept as the option's value (a run refuses to read it from inside --out)."""
    if value is None:
        return None
    try:
        table = tomllib.loads(value.read_text())
    except OSError as exc:
        raise HookdumpError(f"--config {value}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise HookdumpError(f"--config {value} is not a text file; give a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise HookdumpError(f"--config {value} is not valid TOML: {exc}") from None
    except RecursionError:
        raise HookdumpError(
            f"--config {value} is nested too deeply to read; a config is a flat table of options"
        ) from None
    by_key = _params_by_key(ctx)
    defaults: dict[str, Any] = {}
    for key, setting in table.items():
        if key not in by_key or key == "config":
            raise HookdumpError(
                f"--config {value}: {key!r} is not an option of `hookdump {ctx.info_name}`"
                f"{did_you_mean(key, by_key)}; keys are option names with _ for -"
            )
        target = by_key[key]
        if getattr(target, "multiple", False) and not isinstance(setting, list):
            setting = [setting]
        defaults[target.name] = [str(s) for s in setting] if isinstance(setting, list) else setting
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    # for the error handler: a bad value from the file names the file and key, not the flag
    ctx.meta[CONFIG_META] = (value, {by_key[key].name: key for key in table})
    return value


def config_value_error(exc: typer.BadParameter) -> str | None:
    """The one-line message for a bad value that came from `--config`, else None."""
    ctx, param = exc.ctx, exc.param
    if ctx is None or param is None or CONFIG_META not in ctx.meta or param.name is None:
        return None
    source = ctx.get_parameter_source(param.name)
    if source is None or source.name != "DEFAULT_MAP":
        return None
    path, keys = ctx.meta[CONFIG_META]
    key = keys.get(param.name, param.name)
    value = (ctx.default_map or {}).get(param.name)
    return f"--config {path}: {key} = {value!r} is not valid ({exc.message})"


def _params_by_key(ctx: typer.Context) -> dict[str, Any]:
    """Config keys (long option names with _ for -, argument names) -> the parameter."""
    keys: dict[str, Any] = {}
    for param in ctx.command.params:
        longs = [opt for opt in param.opts if opt.startswith("--")]
        for opt in longs or [param.name]:
            keys[opt.removeprefix("--").replace("-", "_")] = param
    return keys


ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        metavar="FILE.toml",
        help="Read options from a TOML table (keys: option names with _ for -).",
        callback=load_config,
        is_eager=True,
        show_default=False,
    ),
]
