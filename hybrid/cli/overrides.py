"""A command line checked before a verb runs: every key it names exists, and every mandatory key gets a value.

Hydra on its own lets two mistakes through. A key that is not in the config gets the hint "To append
to your config use +KEY=VALUE", and with the plus the option is added and silently ignored
(``+num_beam=4`` decodes with one beam). A key left at ``???`` ends in an omegaconf traceback. Here
each is one line that names the key: the nearest valid keys for a typo, what to give for a missing one.

The rule for additions (``+KEY=VALUE``, and ``++KEY=VALUE`` where the key is absent): a config's keys
are closed, except where a node says what it makes. A node with a ``_target_`` takes any keyword
argument of its target (``+trainer.profiler=simple``: any ``lightning.Trainer`` argument;
``+callbacks.early_stopping.min_delta=0.1``), checked against the target's signature. A node whose
every entry makes an object (``callbacks``, ``logger``) takes a new entry with its ``_target_``
(``+callbacks.kill._target_=my.Callback``, then its arguments). Anything else added is a typo.
Config groups (``model=transformer``), Hydra's own ``hydra.*`` keys and flags (``-m``, ``--cfg``,
``--help``) are left to Hydra, as is any command line Hydra will refuse in its own words.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.resources
import inspect
import pydoc
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from hydra import compose, initialize_config_module
from hydra._internal.utils import get_args_parser  # the parser hydra.main reads its command line with
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

CONFIG_MODULE = "hybrid.configs"
MISSING = "???"
# Keys Hydra's instantiate reads on any node with a _target_, whatever the target takes.
INSTANTIATE_KEYS = frozenset({"_target_", "_args_", "_partial_", "_convert_", "_recursive_"})
_NOT_FOUND = object()


class CommandLineError(ValueError):
    """A command line naming a key the verb's config does not have, or leaving a mandatory key unset."""


def exit_on_bad_command_line(verb: str, config_name: str, arguments: Sequence[str]) -> None:
    """Run :func:`check_command_line`; on a bad command line print ``hybrid VERB: ...`` on standard
    error and exit with status 2 (a usage error), before Hydra makes a run folder."""
    try:
        check_command_line(verb, config_name, arguments)
    except CommandLineError as error:
        sys.stderr.write(f"hybrid {verb}: {error}\n")
        raise SystemExit(2) from None


def check_command_line(verb: str, config_name: str, arguments: Sequence[str]) -> None:
    """Raise :class:`CommandLineError` if an override of ``hybrid VERB ARGUMENTS`` names a key that the
    root config ``config_name`` (with the groups the command line picks) does not have and may not
    take (the module's rule), or if a mandatory (``???``) key is left without a value.

    Each sweep is checked at its first value. ``--cfg`` prints a config without running it, so its
    mandatory keys may stay unset; ``--help`` and the other flags that run nothing are not checked.
    """
    command_line = read_command_line(arguments)
    if command_line is None:
        return  # a command line Hydra refuses itself, naming what is wrong
    flags, overrides = command_line
    if any((flags.help, flags.hydra_help, flags.info, flags.shell_completion, flags.config_path, flags.config_name,
            flags.config_dir, flags.experimental_rerun)):
        return  # Hydra's own business
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        groups = set(GlobalHydra.instance().config_loader().list_groups(""))
        choices = [override for override in overrides if _is_group(override, groups)]
        keys = [override for override in overrides if not _is_group(override, groups)]
        try:
            cfg = compose(config_name, overrides=[_first_line(override) for override in choices
                                                  if not override.key_or_group.startswith("hydra")])
        except (HydraException, OmegaConfBaseException):
            return  # an unknown group option or a broken file: Hydra names it, with the options there are
    tree = OmegaConf.to_container(cfg, resolve=False)
    for override in keys:
        if not override.key_or_group.startswith("hydra."):
            _apply(tree, override, verb)
    missing = list(_missing_keys(tree))
    if missing and flags.cfg is None:
        raise CommandLineError(_describe_missing(missing, config_name))


def read_command_line(arguments: Sequence[str]) -> tuple[argparse.Namespace, list[Override]] | None:
    """Hydra's flags and parsed overrides of a verb's ``arguments``, read as ``hydra.main`` reads them; None
    for a command line Hydra will refuse itself (an unknown flag, a malformed override)."""
    flags, unparsed = get_args_parser().parse_known_args(list(arguments))
    if unparsed:
        return None
    try:
        return flags, OverridesParser.create().parse_overrides(flags.overrides)
    except HydraException:
        return None


def nearest_keys(key: str, valid: Sequence[str], count: int = 3) -> list[str]:
    """The ``count`` keys of ``valid`` (dotted) closest to ``key`` (difflib's ratio, at least 0.6),
    closest first. A key may be typed without its leading nodes: ``max_epoch`` finds
    ``trainer.max_epochs``, ``num_beam`` finds ``generation.num_beams``."""
    spellings: dict[str, list[str]] = {}
    for full in valid:
        parts = full.split(".")
        for start in range(len(parts)):
            spellings.setdefault(".".join(parts[start:]), []).append(full)
    nearest = [full for spelling in difflib.get_close_matches(key, spellings, n=count)
               for full in spellings[spelling]]
    return list(dict.fromkeys(nearest))[:count]


def _is_group(override: Override, groups: set[str]) -> bool:
    return "." not in override.key_or_group and override.key_or_group.split("/")[0] in groups


def _first_line(override: Override) -> str:
    """The override as one run would see it: a sweep at its first value."""
    if not override.is_sweep_override():
        return override.input_line
    return f"{override.get_key_element()}={next(override.sweep_string_iterator())}"


def _first_value(override: Override) -> Any:
    return next(override.sweep_iterator()) if override.is_sweep_override() else override.value()


def _apply(tree: dict, override: Override, verb: str) -> None:
    """Check one key override against ``tree`` (the config as the overrides before it left it) and
    apply it, so that later overrides see what it added."""
    key = override.key_or_group
    value = _first_value(override) if override.type is not OverrideType.DEL else None
    exists = _lookup(tree, key) is not _NOT_FOUND
    if override.type is OverrideType.ADD and exists:
        raise CommandLineError(f"{key} is already in the config: set it without the plus, {key}=...")
    if override.type is OverrideType.DEL and exists:
        parent_key, _, name = key.rpartition(".")
        parent = _lookup(tree, parent_key) if parent_key else tree
        del parent[int(name) if isinstance(parent, list) else name]
        return
    if not exists:
        addable = override.type in (OverrideType.ADD, OverrideType.FORCE_ADD)
        if not (addable and _may_add(tree, key, value)):
            raise CommandLineError(_describe_unknown(tree, override, verb, addable))
    _assign(tree, key, value)


def _may_add(tree: dict, key: str, value: Any) -> bool:
    """Whether the module's rule lets ``+key=value`` add ``key``."""
    parent_key, _, name = key.rpartition(".")
    if not parent_key:
        return False  # the root makes no object: its keys are the config's own
    parent = _lookup(tree, parent_key)
    if isinstance(parent, dict) and parent.get("_target_"):
        allowed = _keyword_arguments(parent["_target_"])
        return allowed is None or name in allowed or name in INSTANTIATE_KEYS
    if parent is not _NOT_FOUND:  # a whole new entry: +callbacks.kill={_target_: ..., ...}
        return _holds_objects(parent) and isinstance(value, dict) and "_target_" in value
    grandparent_key = parent_key.rpartition(".")[0]  # a new entry started by its target: +callbacks.kill._target_=...
    return name == "_target_" and bool(grandparent_key) and _holds_objects(_lookup(tree, grandparent_key))


def _holds_objects(node: Any) -> bool:
    """Whether ``node`` is a set of objects (``callbacks``, ``logger``): entries that each have a ``_target_``."""
    return (isinstance(node, dict) and bool(node) and "_target_" not in node
            and all(entry is None or (isinstance(entry, dict) and "_target_" in entry) for entry in node.values()))


def _keyword_arguments(target: str) -> set[str] | None:
    """The keyword arguments ``target`` takes; None where it takes any (``**kwargs``) or cannot be
    imported here (instantiate then reports it, naming the target). A class whose ``__init__`` passes
    ``**kwargs`` on takes its bases' arguments too (the data modules pass their loader options to
    ``Seq2SeqDataModule``), so they are followed up the MRO until an ``__init__`` without ``**kwargs``."""
    made = pydoc.locate(target)
    if isinstance(made, type):
        callables = [klass.__init__ for klass in made.__mro__ if "__init__" in vars(klass)]
    else:
        callables = [made]
    names: set[str] = set()
    for function in callables:
        try:
            parameters = inspect.signature(function).parameters.values()
        except (ValueError, TypeError):  # None (not importable) or a callable without a signature
            return None
        names |= {parameter.name for parameter in parameters
                  if parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
        if not any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
            return names - {"self"}
    return None  # every __init__ up to object's takes **kwargs: anything goes


def _describe_unknown(tree: dict, override: Override, verb: str, addable: bool) -> str:
    key = override.key_or_group
    valid = list(_keys(tree))
    parent_key = key.rpartition(".")[0]
    parent = _lookup(tree, parent_key) if parent_key else None
    if isinstance(parent, dict) and parent.get("_target_"):
        valid += [f"{parent_key}.{name}" for name in sorted(_keyword_arguments(parent["_target_"]) or ())]
    nearest = nearest_keys(key, valid)
    hint = f"did you mean {_either(nearest)}?" if nearest else f"`hybrid {verb} --help` lists every key"
    return f"unknown key {key!r} in {override.input_line!r}{_addition_rule(tree) if addable else ''}; {hint}"


def _addition_rule(tree: dict) -> str:
    """The module's rule for additions, in the words of this config's nodes."""
    collections = [name for name, node in tree.items() if _holds_objects(node)]
    objects = [name for name, node in tree.items() if isinstance(node, dict) and node.get("_target_")]
    if not collections + objects:
        return " (this config takes no new keys)"
    rule = f" (a plus adds only an argument of what {_either(objects + collections)} make"
    return rule + (f", or a new entry with its _target_ to {_either(collections)})" if collections else ")")


def _either(names: Sequence[str]) -> str:
    return " or ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} or {names[-1]}"


def _describe_missing(keys: list[str], config_name: str) -> str:
    """What to give for each mandatory key, from its comment in the root config where it has one."""
    text = importlib.resources.files(CONFIG_MODULE).joinpath(f"{config_name}.yaml").read_text()
    wanted = []
    for key in keys:
        comment = re.search(rf"^{re.escape(key)}:\s*\?\?\?\s*#\s*(.+)$", text, flags=re.M)
        wanted.append(f"{key}=<{comment.group(1).strip() if comment else 'a value'}>")
    return f"{' and '.join(keys)} must be given: {' '.join(wanted)}"


def _lookup(tree: Any, key: str) -> Any:
    """The value at dotted ``key`` (list items by index), or ``_NOT_FOUND``."""
    node = tree
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _NOT_FOUND
    return node


def _assign(tree: dict, key: str, value: Any) -> None:
    *parents, name = key.split(".")
    node = tree
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if isinstance(node, list):
        node[int(name)] = value
    else:
        node[name] = value


def _keys(tree: dict, prefix: str = "") -> Iterator[str]:
    """Every dotted key of ``tree``'s nodes (not inside lists), parents before children."""
    for name, value in tree.items():
        yield prefix + name
        if isinstance(value, dict):
            yield from _keys(value, f"{prefix}{name}.")


def _missing_keys(tree: dict, prefix: str = "") -> Iterator[str]:
    for name, value in tree.items():
        if value == MISSING:
            yield prefix + name
        elif isinstance(value, dict):
            yield from _missing_keys(value, f"{prefix}{name}.")
