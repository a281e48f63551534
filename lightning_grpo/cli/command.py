"""The ``lightning-grpo`` command line (also ``python -m lightning_grpo``): Lightning's ``LightningCLI`` for GRPO.

A run is a YAML config with the usual LightningCLI sections, ``trainer``, ``model`` and ``data``, where ``model`` is
:class:`~lightning_grpo.GRPOModule` or any subclass of it and ``data`` is any LightningDataModule (usually
:class:`~lightning_grpo.data.PromptDataModule`), each given as ``class_path`` plus ``init_args``::

    lightning-grpo fit --config configs/debug/tiny.yaml                       # tiny model, CPU, offline
    lightning-grpo fit --config configs/qwen2.5-0.5b/gsm8k-lora.yaml --trainer.max_steps=50
    lightning-grpo fit --config my.yaml --print_config > full.yaml            # every setting, reusable as a config
    lightning-grpo fit --model.help lightning_grpo.GRPOModule                 # the module's arguments
    lightning-grpo fit --model.help lightning_grpo.GRPOModule --model.grpo.help   # every GRPOConfig field

Reward functions are import paths or ``class_path`` instances, the optimizer and scheduler are the module's own
``optimizer`` / ``lr_scheduler`` arguments (stepped once per GRPO iteration)::

    model:
      class_path: lightning_grpo.GRPOModule
      init_args:
        model: Qwen/Qwen2.5-0.5B-Instruct
        reward_funcs:
          - lightning_grpo.rewards.math_answer
          - class_path: lightning_grpo.rewards.FormatReward
            init_args: {pattern: "<answer>.*?</answer>", full_match: false}
        reward_weights: [1.0, 0.2]
        optimizer: {class_path: torch.optim.AdamW, init_args: {lr: 2.0e-5}}

Besides LightningCLI's keys, a config may set ``torch_num_threads`` (CPU threads for PyTorch; left out, a fit on CPU
uses 1 for models under 5M parameters and the cores other processes leave free, at most 8, for larger ones: see
:mod:`lightning_grpo.iteration.cpu_threads`).
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

from jsonargparse import Namespace, set_parsing_settings
from lightning.pytorch import Callback, LightningDataModule, Trainer
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lightning_grpo.callbacks import GRPOProgressBar
from lightning_grpo.checkpoint import CheckpointMismatchError, CheckpointWriteError, UnreadableCheckpointError
from lightning_grpo.cli.argument_checks import (
    SUBCOMMANDS,
    import_from_working_directory,
    refuse_moved_settings,
    without_debug_flag,
)
from lightning_grpo.cli.argument_parser import SuggestingParser
from lightning_grpo.cli.before_loading import DESCRIPTION, answer_without_libraries, building_started, program_name
from lightning_grpo.cli.config_checks import check_conversational_prompts, check_optimizers, check_prompt_files
from lightning_grpo.cli.errors import DEBUG_HINT, debug_enabled, setting_key
from lightning_grpo.cli.resume import ReplayMetrics, continue_in_checkpoint_folder, earlier_rows
from lightning_grpo.cli.summary import curve_path_left_to_summary, fit_summary
from lightning_grpo.data import MissingDataError
from lightning_grpo.extras import MissingExtraError
from lightning_grpo.iteration.cpu_threads import set_cpu_threads
from lightning_grpo.module import GRPOModule
from lightning_grpo.policy import ModelLoadError
from lightning_grpo.rewards import RewardInputError, RewardOutputError
from lightning_grpo.settings_checks import SettingError

__all__ = ["GRPOCLI", "main", "parse_config"]

#: Errors whose message is the whole story: printed in one line, without a traceback (docs/troubleshooting.md).
_USER_ERRORS = (
    ModelLoadError,
    UnreadableCheckpointError,
    CheckpointMismatchError,
    CheckpointWriteError,
    MissingDataError,
    RewardInputError,
    RewardOutputError,
    SettingError,
    MissingExtraError,
)


class GRPOCLI(LightningCLI):
    """``LightningCLI`` over :class:`~lightning_grpo.GRPOModule` and any ``LightningDataModule``.

    Both are base classes (``subclass_mode``): a config names the classes with ``class_path``, so a user's
    GRPOModule subclass and data module work from YAML (the usual data module is
    :class:`~lightning_grpo.data.PromptDataModule`). Optimizer and scheduler are the module's ``optimizer`` and
    ``lr_scheduler`` arguments; LightningCLI's top-level ``optimizer`` / ``lr_scheduler`` keys are off (GRPO
    optimizes manually and steps its scheduler once per iteration). The extra top-level key ``torch_num_threads``
    sets PyTorch's CPU threads before anything is built.

    Args:
        args: Arguments to parse instead of ``sys.argv[1:]`` (a list, or a dict as LightningCLI accepts).
        run: Run the subcommand (``fit``, ``validate``, ...); ``False`` only parses and instantiates.
        **kwargs: Other ``LightningCLI`` arguments (e.g. ``trainer_defaults``, ``save_config_kwargs``); they
            override this class's defaults.

    Example::

        from lightning_grpo.cli import GRPOCLI

        cli = GRPOCLI(args=["--config", "configs/debug/tiny.yaml", "--trainer.max_steps=2"], run=False)
        cli.trainer.fit(cli.model, cli.datamodule)
    """

    def __init__(self, args: Any = None, run: bool = True, *, run_name: str = "fit", **kwargs: Any) -> None:
        self._started = time.perf_counter()  # the fit's last line counts from here
        self.run_name = run_name  # the fit's last line starts with it: "fit: mean reward ..." ("demo" for the demo)
        options: dict[str, Any] = {
            "model_class": GRPOModule,
            "datamodule_class": LightningDataModule,  # any data module; PromptDataModule is the usual one
            "subclass_mode_model": True,
            "subclass_mode_data": True,
            "auto_configure_optimizers": False,
            "parser_class": SuggestingParser,  # a misspelt setting: "did you mean ..." on the error's first line
            # without a logger the config goes to default_root_dir: a rerun replaces it (with a logger, each run has
            # its own version_N folder); docs/troubleshooting.md
            "save_config_kwargs": {"overwrite": True},
            # the table of a LoRA policy says little (FLOPs 0) and would push a first error below it
            "trainer_defaults": {"enable_model_summary": False, **kwargs.pop("trainer_defaults", {})},
        }
        parser_kwargs = {"description": DESCRIPTION, "allow_abbrev": False, **kwargs.pop("parser_kwargs", {})}
        refuse_moved_settings(sys.argv[1:] if args is None else args, parser_kwargs.get("prog"))
        # each setting's help is the docstring under its field (GRPOConfig, PolicyConfig, VLLMConfig): on before the
        # parser is built, as jsonargparse reads the docstrings when it adds a class's arguments
        set_parsing_settings(docstring_parse_attribute_docstrings=True)
        # a function given by import path (agent:, a reward) is kept as its path in the saved config: nothing to say
        warnings.filterwarnings("ignore", message=r"\s*Unable to serialize instance")
        super().__init__(**{**options, **kwargs}, parser_kwargs=parser_kwargs, args=args, run=run)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Add ``torch_num_threads``."""
        parser.add_argument(
            "--torch_num_threads",
            type=int | None,
            default=None,
            help="CPU threads for PyTorch (torch.set_num_threads); null: on CPU, 1 for models under 5M parameters, "
            "else the cores other processes leave free (at most 8), unless OMP_NUM_THREADS is set "
            "(lightning_grpo.iteration.cpu_threads).",
        )

    def _parse_ckpt_path(self) -> None:
        """Keep the config as given when resuming: LightningCLI would re-read the checkpoint's hyperparameters here.

        LightningCLI replaces the model's config by the hyperparameters saved in the checkpoint (which do not hold
        ``reward_funcs`` or the optimizer, so that fails), silently dropping settings changed on the command line.
        Here the config is the one given; the module compares it with the checkpoint when it is restored: a changed
        algorithm setting or learning rate takes effect, a different base model or LoRA shape is refused
        (docs/distributed.md, resuming).
        """

    def instantiate_classes(self) -> None:
        """Instantiate as LightningCLI does; a refused setting or an unloadable model is one line, not a union.

        A :class:`~lightning_grpo.settings_checks.SettingError` names the setting by its key in the config
        (``model.init_args.grpo.sampling.num_generations=1: ...``).
        """
        try:
            super().instantiate_classes()
        except Exception as error:
            cause = _root_cause(error, _USER_ERRORS)
            if cause is None or debug_enabled():
                raise
            if isinstance(cause, SettingError):  # named by its class: name it by its key in the config instead
                config = self.config[self.subcommand] if self.subcommand else self.config
                cause = cause.renamed(setting_key(config, cause))
            raise cause from None

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        """Lightning's, with :class:`~lightning_grpo.callbacks.GRPOProgressBar` unless disabled or set by the config."""
        configured = config.get("callbacks") or []
        configured = configured if isinstance(configured, list) else [configured]
        chosen = any(isinstance(callback, ProgressBar) for callback in [*configured, *callbacks])
        if config.get("enable_progress_bar") is not False and not chosen:
            callbacks = [*callbacks, GRPOProgressBar()]  # last: it shows what the other callbacks logged in the step
        replay = [ReplayMetrics(self._replay)] if getattr(self, "_replay", None) else []
        return super()._instantiate_trainer(config, [*replay, *callbacks])

    def fit(self, **kwargs: Any) -> None:
        """``Trainer.fit`` (LightningCLI calls it for ``fit``); the reward curve's path is left to :meth:`after_fit`.

        Args:
            **kwargs: ``Trainer.fit``'s arguments (``model``, ``datamodule``, ``ckpt_path``).
        """
        with curve_path_left_to_summary():
            self.trainer.fit(**kwargs)

    def after_fit(self) -> None:
        """Say where the run's metrics, checkpoint, adapter and reward curve went, then the mean reward at its start
        and end (LightningCLI calls it after ``fit``)."""
        if self.trainer.is_global_zero:
            print(fit_summary(self.trainer, time.perf_counter() - self._started, self.run_name), flush=True)

    def before_instantiate_classes(self) -> None:
        """Apply ``torch_num_threads``, check the optimizers' settings and a PromptDataModule's files before the model
        is built."""
        building_started()  # the "still loading" lines end here: what is built next says what it does
        config = self.config[self.subcommand] if self.subcommand else self.config
        # a resumed fit writes on in its version_N folder; test, predict and validate never reuse one (their logger
        # would delete the fit's metrics.csv and overwrite its config.yaml)
        run_folder = continue_in_checkpoint_folder(config) if self.subcommand == "fit" else None
        self._replay = earlier_rows(run_folder) if run_folder else []
        if run_folder:  # its rows are written again (ReplayMetrics), so Lightning's "will be deleted" is not true
            warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
        check_optimizers(config)  # a negative learning rate fails here, naming its key, not after the model loads
        if config.get("torch_num_threads"):
            set_cpu_threads(config.torch_num_threads)
        check_prompt_files(config)
        check_conversational_prompts(config)  # tools or an environment with string prompts: refused before loading


class _Parsed(Exception):
    """Carries the parsed config out of :class:`_ParseOnlyCLI` before anything is seeded or built."""

    def __init__(self, config: Namespace) -> None:
        super().__init__("parsed")
        self.config = config


class _ParseOnlyCLI(GRPOCLI):
    """Parses and checks, then stops: no seeding, no instantiation, no run."""

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse as LightningCLI does, then leave with the config."""
        super().parse_arguments(parser, args)
        raise _Parsed(self.config)


def parse_config(args: Sequence[str]) -> Namespace:
    """Parse and check command-line arguments as ``lightning-grpo`` does, without building or running anything.

    Types are checked and import paths resolved (classes and reward functions are imported, not instantiated), so
    unknown keys, misspelt classes and wrong types fail here; models and datasets are not downloaded.

    Args:
        args: As on the command line, subcommand first: ``["fit", "--config", "configs/debug/tiny.yaml"]``.

    Returns:
        The parsed config; its ``subcommand`` key names the subcommand, whose settings are under that name.

    Raises:
        SystemExit: The arguments do not parse (jsonargparse prints why), as on the command line.
    """
    try:
        _ParseOnlyCLI(args=list(args))
    except _Parsed as parsed:
        return parsed.config
    raise AssertionError("unreachable: parse_arguments always raises _Parsed")  # pragma: no cover


def main(args: Sequence[str] | None = None) -> None:
    """The command line: LightningCLI's subcommands (``fit``, ``validate``, ...) over :class:`GRPOCLI`.

    ``lightning-grpo`` and ``python -m lightning_grpo`` call it through :func:`lightning_grpo.__main__.main`, which
    also runs the demo (``lightning-grpo demo``).

    Args:
        args: Arguments instead of ``sys.argv[1:]``.

    Raises:
        SystemExit: After ``--help`` (status 0); no arguments, a subcommand without any config or model (the
            message shows how to pass one), or arguments that do not parse (status 2).
    """
    argv = without_debug_flag(args)  # --debug: full messages and tracebacks (docs/troubleshooting.md)
    import_from_working_directory()
    prog = program_name()
    answer_without_libraries(argv, prog)  # --help, no arguments, no config: the same answers as before loading
    try:
        GRPOCLI(args=None if args is None else argv, parser_kwargs={"prog": prog})
    except _USER_ERRORS as error:  # the message says what to do; the traceback would only bury it
        if debug_enabled():
            raise
        hint = f"\n{DEBUG_HINT}" if isinstance(error, (SettingError, RewardOutputError)) else ""
        subcommand = f" {argv[0]}" if argv and argv[0] in SUBCOMMANDS else ""
        print(f"{prog}{subcommand}: error: {error}{hint}", file=sys.stderr)
        sys.exit(1)


def _root_cause(error: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of one of ``kinds`` in the chain of ``error`` (its causes and contexts)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, kinds):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
