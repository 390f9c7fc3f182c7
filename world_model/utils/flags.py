"""How every command's flags are made (docs/commands.md): the fields of settings dataclasses, one flag each.

`SettingsParser` builds a command's flags from its settings dataclasses with argparse's public `add_argument` and
fills the dataclasses from them; `settings_main` is the whole `main` of every command (parse, then run the work
under `world_model.utils.cli.run_command`), and `command_line` the command as its records write it.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import types
from typing import Callable, Literal, Sequence, Union, get_args, get_origin, get_type_hints

from world_model.utils.cli import EXIT_USAGE, INPUT_ERRORS, one_line, run_command

VERBOSE_HELP = "show the traceback of an error"
NOT_FLAG_OPTIONS = ("aliases", "flag")  # field metadata the parser reads itself; the rest goes to add_argument


class StoreTuple(argparse.Action):
    """Stores the values of a `nargs="+"` flag as a tuple (the type of a settings dataclass's tuple field)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, tuple(values))


def truth_value(text: str) -> bool:
    """The value of a bool flag given one (`--overwrite true`): yes/no, true/false, t/f, y/n, 1/0, any case."""
    if text.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if text.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(
        f"Truthy value expected: got {text} but expected one of yes/no, true/false, t/f, y/n, 1/0 (case insensitive)."
    )


def choice_of(choices: Sequence) -> Callable[[str], object]:
    """The type of a `Literal` flag: the choice whose text is given (anything else is left for argparse to refuse)."""
    by_text = {str(choice): choice for choice in choices}
    return lambda text: by_text.get(text, text)


def default_of(field: dataclasses.Field) -> object:
    """The field's default (its factory called), or `dataclasses.MISSING` when it has none."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def without_none(kind: object) -> object:
    """`X` for an optional `X | None` (a flag takes one type); other types as they are."""
    if get_origin(kind) not in (Union, types.UnionType) or type(None) not in get_args(kind):
        return kind
    members = [member for member in get_args(kind) if member is not type(None)]
    if len(members) != 1:
        raise TypeError(f"a flag takes one type, not {kind}")
    return members[0]


def flag_options(field: dataclasses.Field, kind: object) -> dict:
    """The `add_argument` keywords of a settings field of type `kind` (`without_none`), as HfArgumentParser makes
    them: its metadata (help, choices, metavar), a type, a default (none: the flag is required) and how many values
    it takes."""
    options = {key: value for key, value in field.metadata.items() if key not in NOT_FLAG_OPTIONS}
    default = default_of(field)
    if kind is bool:  # --x, --x true, --x no: a value may follow
        options["type"] = truth_value
        if default is not None:
            options.update(default=False if default is dataclasses.MISSING else default, nargs="?", const=True)
        return options
    if get_origin(kind) is Literal:
        options.update(choices=get_args(kind), type=choice_of(get_args(kind)))
    elif get_origin(kind) is list:
        options.update(type=get_args(kind)[0], nargs="+")
    elif get_origin(kind) is tuple:  # tuple[int, ...]: one or more values; tuple[int, int]: exactly two
        lengths = get_args(kind)
        options.update(type=lengths[0], nargs="+" if lengths[-1] is Ellipsis else len(lengths), action=StoreTuple)
    else:
        options["type"] = kind
    if default is dataclasses.MISSING:
        options["required"] = True
    else:
        options["default"] = default
    return options


def flag_names(field: dataclasses.Field) -> list[str]:
    """A field's flags: batch_size -> --batch-size, then `metadata["aliases"]`, then --batch_size."""
    aliases = field.metadata.get("aliases", [])
    dashed = [f"--{field.name.replace('_', '-')}", *([aliases] if isinstance(aliases, str) else aliases)]
    return dashed + ([f"--{field.name}"] if "_" in field.name else [])


def add_setting(target, field: dataclasses.Field, kind: object) -> None:
    """The flag of one settings field, added to `target` (a parser or an argument group): `flag_options` under
    `flag_names`; a bool also gets --no-x (listed in the help when it defaults on, as HfArgumentParser does)."""
    target.add_argument(*flag_names(field), dest=field.name, **flag_options(field, kind))
    if kind is bool and field.default is True:
        help_text = field.metadata.get("help")
        names = [f"--no-{field.name.replace('_', '-')}", f"--no_{field.name}"]
        target.add_argument(*names, action="store_false", dest=field.name, default=False, help=help_text)
    elif kind is bool and field.default is False:  # --no-x too, as for a setting that defaults on
        no_name = f"--no-{field.name.replace('_', '-')}"
        target.add_argument(no_name, action="store_false", dest=field.name, help=argparse.SUPPRESS)


def has_flag(field: dataclasses.Field) -> bool:
    """Whether the command line sets the field: not for `init=False` or `metadata={"flag": False}` (it keeps its
    default)."""
    return field.init and field.metadata.get("flag") is not False


class SettingsParser(argparse.ArgumentParser):
    """A command's parser: one flag per field of its settings dataclasses, made from `dataclasses.fields` with
    argparse's public `add_argument` (the flags `transformers.HfArgumentParser` would make: field batch_size ->
    --batch-size, also spelt --batch_size; `metadata["help"]` is the help, `metadata["aliases"]` more names, other
    metadata more `add_argument` keywords; a dataclass's `flag_group` heads its flags' section of the help). A
    tuple field takes its values as a tuple (tuple[int, ...]: one or more; tuple[int, int]: two; required when it
    has no default), a bool setting also accepts --no-x, and a field with `metadata={"flag": False}` gets no flag.
    Positional arguments and flags that are not settings (--verbose) are added with `add_argument`."""

    def __init__(
        self,
        settings: type | tuple[type, ...],
        prog: str,
        description: str,
        formatter_class: type[argparse.HelpFormatter] = argparse.HelpFormatter,
    ):
        super().__init__(prog=prog, description=description, formatter_class=formatter_class)
        self.settings_types = settings if isinstance(settings, tuple) else (settings,)
        for settings_type in self.settings_types:
            group = getattr(settings_type, "flag_group", None)
            target = self.add_argument_group(group) if group else self
            kinds = get_type_hints(settings_type)
            for field in filter(has_flag, dataclasses.fields(settings_type)):
                add_setting(target, field, without_none(kinds[field.name]))

    def parse_settings(
        self, argv: Sequence[str] | None, usage_on_bad_setting: bool = True
    ) -> tuple[tuple, argparse.Namespace]:
        """The settings dataclasses filled from `argv` (None: sys.argv), in the order given to the parser, and a
        namespace of the other arguments (empty when there are none). An unknown flag or a value of the wrong type
        exits 2 with the usage message; so does a setting its dataclass refuses (a ValueError from its checks),
        unless `usage_on_bad_setting` is False: then the ValueError is raised for the command to report."""
        namespace, unknown = self.parse_known_args(None if argv is None else list(argv))
        try:
            settings = tuple(settings_from(namespace, settings_type) for settings_type in self.settings_types)
        except ValueError as err:
            if not usage_on_bad_setting:
                raise
            self.error(one_line(err))
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return settings, namespace


def settings_from(namespace: argparse.Namespace, settings_type: type) -> object:
    """A `settings_type` made from its flags' values, which are taken out of `namespace`."""
    values = vars(namespace)
    return settings_type(**{f.name: values.pop(f.name) for f in dataclasses.fields(settings_type) if has_flag(f)})


def add_verbose(parser: argparse.ArgumentParser, help_text: str = VERBOSE_HELP) -> None:
    """The `--verbose` flag every command has: an error shows its traceback (`help_text`: what else it shows)."""
    parser.add_argument("--verbose", action="store_true", help=help_text)


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """The command as a record writes it, to be run again: "python -m MODULE ARGS", the arguments (`argv`, None:
    sys.argv[1:]) shell-quoted."""
    return f"python -m {module} " + shlex.join(sys.argv[1:] if argv is None else list(argv))


def settings_main(
    settings: type | tuple[type, ...],
    module: str,
    description: str,
    work: Callable[..., object],
    argv: Sequence[str] | None,
    *,
    arguments: Callable[[SettingsParser], None] | None = None,
    usage_on_bad_setting: bool = True,
    formatter_class: type[argparse.HelpFormatter] = argparse.HelpFormatter,
    on_interrupt: str = "",
    input_errors: tuple[type[BaseException], ...] = INPUT_ERRORS,
) -> int:
    """The `main` of `python -m MODULE`, every command's: parse `argv` (None: sys.argv) into the `settings`
    dataclasses (one type or several) and --verbose, then `run_command(work(*settings, command_line(module, argv)))`
    with `on_interrupt` and `input_errors`; the exit code.

    `arguments(parser)`, when given, adds the command's other arguments (positional ones, switches) in place of
    --verbose (`add_verbose` adds it back where the help should list it; a --debug flag shows tracebacks too), and
    `work` gets their namespace after the settings: `work(*settings, args, command)`. A setting its dataclass
    refuses exits 2 with the usage message, or, with `usage_on_bad_setting` False, with one `error:` line."""
    parser = SettingsParser(
        settings, prog=f"python -m {module}", description=description, formatter_class=formatter_class
    )
    (arguments or add_verbose)(parser)
    try:
        settings_given, args = parser.parse_settings(argv, usage_on_bad_setting)
    except ValueError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    inputs = (*settings_given, args) if arguments else settings_given
    command = command_line(module, argv)
    return run_command(
        lambda: work(*inputs, command),
        verbose=getattr(args, "verbose", False) or getattr(args, "debug", False),
        on_interrupt=on_interrupt,
        input_errors=input_errors,
    )
