"""The ``tiering`` command: check a config, look into what a tier holds, pin prefixes, replay traces.

A separate distribution from tiering-core, so that an engine deployment
installs only the runtime: ``pip install tiering-cli`` adds the command (and
tqdm for its progress bars). Modules: :mod:`~tiering.cli.main` (the argument
parser and the entry point), :mod:`~tiering.cli.commands` (``check``, ``ls``,
``stat``, ``gc``, ``verify``), :mod:`~tiering.cli.pin` (``pin``),
:mod:`~tiering.cli.options` (flags shared by subcommands), :mod:`~tiering.cli.stacks` (the stack a
subcommand opens: a CONFIG, ``--root``, ``--tier``, or a namespace the root holds),
:mod:`~tiering.cli.terminal` (safe printing), :mod:`tiering.cli.bench`
(``tiering bench``).
"""
