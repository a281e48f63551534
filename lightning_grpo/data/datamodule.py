"""``PromptDataModule``: batches of prompt texts (and their other columns) for GRPO training, validation, test and
prediction."""

from __future__ import annotations

from functools import partial
from typing import Any

from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader

from lightning_grpo.agents.message_checks import string_prompts_refused
from lightning_grpo.data.prompts import (
    IndexedRow,
    as_messages,
    collate_prompts,
    columns_of,
    prompt_lengths,
    render_prompt,
    split_records,
    template_fields,
)
from lightning_grpo.data.sampler import StreamLoader, StreamSampler
from lightning_grpo.data.sources import _HF_PREFIX, PromptSource, check_source_path, load_records
from lightning_grpo.settings_checks import SettingError, check_number

__all__ = ["PromptDataModule"]

#: The prompt sources read only when their stage asks for batches (``trainer.test``, ``trainer.predict``).
_HELD = {"test_data": "test", "predict_data": "predict"}


class PromptDataModule(LightningDataModule):
    """Prompts for GRPO: loads records, formats each prompt, drops over-long ones and batches them as lists.

    A batch is a dict of lists: ``"prompt"`` holds the formatted prompt texts and every other column of the records
    (answers, metadata for reward functions) comes along under its own name, ``None`` where a row lacks it. When
    ``prompt_field`` is not ``"prompt"`` the original column stays under its name too.

    The prompt of a row is ``prompt_template.format(**row)`` (or the row's ``prompt_field``): a text, or a list of chat
    messages (``[{"role": "user", "content": ...}]``, conversational data). With ``chat_template=True`` a text becomes
    the user turn of a conversation after an optional system turn; conversations are kept as messages and rendered
    by the tokenizer's chat template when the module samples (``docs/agents.md``). Without it a ``system_prompt`` is
    prepended to a text followed by a newline. ``tokenizer`` and
    ``max_prompt_length`` left as ``None`` are taken in :meth:`setup` from the attached LightningModule's attributes
    of the same names. Prompts longer than ``max_prompt_length`` tokens are dropped with one warning.

    The training order depends only on ``seed`` and the epoch, the last incomplete batch is dropped, and under
    DDP/FSDP every rank gets its own prompts and the same number of full batches. A run resumed from a checkpoint
    taken mid-epoch continues with the prompts it had not seen: the training loader is resumable in Lightning's
    sense (:class:`~lightning_grpo.data.sampler.StreamLoader`), so Lightning saves its position with the loop state.
    ``test_data`` and ``predict_data`` are read when ``trainer.test`` and ``trainer.predict`` ask for their batches
    (docs/evaluation.md); their batches keep the data's order, as validation's do.

    Args:
        train_data: Training prompts: any source :func:`~lightning_grpo.data.load_records` accepts — a ``.jsonl`` or
            ``.json`` path, a list of dicts, a ``datasets.Dataset``, ``"hf:<name>[@<split>]"``.
        val_data: Validation prompts, same kinds; a Hugging Face source must name its split (``"hf:<name>@test"``).
        val_split: Fraction in ``[0, 1)`` of the training records held out (seeded) for validation when
            ``val_data`` is ``None``.
        test_data: Test prompts (``trainer.test``, ``lightning-grpo test``), same kinds as ``val_data``.
        predict_data: Prompts to sample completions for (``trainer.predict``, ``lightning-grpo predict``), same kinds.
        prompt_field: Column holding the prompt.
        batch_size: Prompts per training batch (per rank); each is sampled G times by the module.
        val_batch_size: Prompts per validation, test and predict batch; defaults to ``batch_size``.
        max_prompt_length: Longest prompt kept, in tokens (without special tokens).
        tokenizer: A tokenizer or a name/path for ``AutoTokenizer.from_pretrained``; needed by ``chat_template``
            and ``max_prompt_length``.
        chat_template: Make text prompts conversational (the user turn), rendered by the tokenizer's chat template.
        system_prompt: System message: a system turn with ``chat_template``, otherwise a prefix line.
        prompt_template: ``str.format`` template over the row's columns, e.g. ``"Question: {question}\\nAnswer:"``.
        hf_config: Configuration name of Hugging Face dataset sources.
        num_workers: DataLoader worker processes.
        shuffle: Shuffle the training prompts.
        seed: Seed of the validation split and of the shuffling.

    Example::

        from lightning_grpo.data import PromptDataModule
        from lightning_grpo.testing import build_tiny_tokenizer, make_task

        dm = PromptDataModule(make_task("addition"), val_split=0.25, batch_size=4,
                              tokenizer=build_tiny_tokenizer(), max_prompt_length=16)
        dm.setup("fit")
        batch = next(iter(dm.train_dataloader()))
        assert len(batch["prompt"]) == 4 and batch["prompt"][0].endswith("=")  # e.g. "3+4="
        assert set(batch) == {"dataset_index", "prompt", "answer"}  # dataset_index: the row in the data
    """

    def __init__(
        self,
        train_data: PromptSource,
        val_data: PromptSource | None = None,
        *,
        val_split: float = 0.0,
        test_data: PromptSource | None = None,
        predict_data: PromptSource | None = None,
        prompt_field: str = "prompt",
        batch_size: int = 8,
        val_batch_size: int | None = None,
        max_prompt_length: int | None = None,
        tokenizer: Any = None,
        chat_template: bool = False,
        system_prompt: str | None = None,
        prompt_template: str | None = None,
        hf_config: str | None = None,
        num_workers: int = 0,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.train_data, self.val_data, self.val_split = train_data, val_data, val_split
        self.test_data, self.predict_data = test_data, predict_data
        self.prompt_field, self.prompt_template = prompt_field, prompt_template
        self.batch_size, self.val_batch_size = batch_size, val_batch_size
        self.max_prompt_length, self.tokenizer = max_prompt_length, tokenizer
        self.chat_template, self.system_prompt = chat_template, system_prompt
        self.hf_config, self.num_workers, self.shuffle, self.seed = hf_config, num_workers, shuffle, seed
        _check_arguments(self)
        self.train_records: list[dict[str, Any]] | None = None
        self.tool_schemas: list[dict[str, Any]] | None = None
        self.val_records: list[dict[str, Any]] = []
        self.held_records: dict[str, list[dict[str, Any]]] = {}  # test_data's and predict_data's, read when asked
        self._stream: tuple[StreamSampler, Any] | None = None  # the training sampler and its collate function

    def prepare_data(self) -> None:
        """Download Hugging Face dataset sources into the local cache (called on one process per node)."""
        held = ((getattr(self, name), None) for name in _HELD)
        for source, split in ((self.train_data, "train"), (self.val_data, None), *held):
            if isinstance(source, str) and source.startswith(_HF_PREFIX):
                self._load(source, split)

    def setup(self, stage: str | None = None) -> None:
        """Load, split, format and filter the prompts (once), and check their form against the attached module's.

        Raises:
            SettingError: The module has tools or an environment and a prompt is a string (the message names the
                row and the fix: ``chat_template=True`` or conversational rows), before the first rollout.
        """
        if self.train_records is None:
            self._load_and_format()
        self._check_prompts_fit_the_agent()

    def _load_and_format(self) -> None:
        """Load, split, format and filter the prompts into ``train_records`` and ``val_records``."""
        self._resolve_from_module()
        if isinstance(self.tokenizer, str):
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer)
        if self.max_prompt_length is not None and self.tokenizer is None:
            raise ValueError(f"max_prompt_length={self.max_prompt_length} needs a tokenizer; pass tokenizer=...")
        train, val = self._load(self.train_data, "train"), []
        if self.val_data is not None:
            val = self._load(self.val_data, None)
        elif self.val_split > 0:
            train, val = split_records(train, self.val_split, self.seed)
        train = [self._format(row, f"train_data row {i}", i) for i, row in enumerate(train)]
        val = [self._format(row, f"val_data row {i}", i) for i, row in enumerate(val)]
        self.train_records, self.val_records = self._drop_long(train, val)

    def train_dataloader(self) -> StreamLoader:
        """Batches of ``batch_size`` prompts in an order fixed by ``(seed, epoch)``; incomplete batches are dropped.

        The sampler is a :class:`~lightning_grpo.data.sampler.StreamSampler`: under DDP each rank takes its own
        slice, and :meth:`extra_batches` draws from the same order. The loader is a
        :class:`~lightning_grpo.data.sampler.StreamLoader`, whose ``state_dict`` Lightning saves in checkpoints, so a
        run resumed in the middle of an epoch continues with the prompts it had not trained on yet.
        """
        if self.train_records is None:
            self.setup("fit")
        world_size, rank = self._world()
        if len(self.train_records) < self.batch_size * world_size:
            raise ValueError(
                f"{len(self.train_records)} training prompts are fewer than batch_size={self.batch_size} x "
                f"world_size={world_size}: no full batch; lower batch_size or add prompts"
            )
        sampler = StreamSampler(
            len(self.train_records),
            batch_size=self.batch_size,
            num_replicas=world_size,
            rank=rank,
            shuffle=self.shuffle,
            seed=self.seed,
        )
        loader = StreamLoader(
            self.train_records,
            sampler=sampler,
            trained=self._trained_in_epoch,
            **self._loader_options(self.train_records, self.batch_size, drop_last=True),
        )
        self._stream = (sampler, loader.collate_fn)
        return loader

    def extra_batches(self, num_batches: int = 1) -> list[dict[str, list[Any]]]:
        """Up to ``num_batches`` more training batches, drawn from the training order (dynamic sampling).

        They come from the same sampler stream as the training batches, so no prompt repeats within an epoch; fewer
        (or none) are returned when the epoch has no full batch left. The training loader's ``state_dict`` counts
        them, so a resumed run draws what the uninterrupted one would.
        """
        if self._stream is None:
            raise RuntimeError("extra_batches needs the training dataloader: call it while fitting")
        sampler, collate = self._stream
        drawn = (sampler.draw() for _ in range(num_batches))
        return [collate([self.train_records[i] for i in indices]) for indices in drawn if indices is not None]

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        """Validation batches in order, or ``[]`` when there is no validation data."""
        if self.train_records is None:
            self.setup("validate")
        if not self.val_records:
            return []
        batch_size = self.val_batch_size or self.batch_size
        return DataLoader(self.val_records, **self._loader_options(self.val_records, batch_size, drop_last=False))

    def test_dataloader(self) -> DataLoader:
        """Batches of ``test_data`` in order (``val_batch_size`` prompts each): ``trainer.test``."""
        return self._held_loader("test_data")

    def predict_dataloader(self) -> DataLoader:
        """Batches of ``predict_data`` in order (``val_batch_size`` prompts each): ``trainer.predict``."""
        return self._held_loader("predict_data")

    def _held_loader(self, name: str) -> DataLoader:
        """In-order batches of the prompts of ``name`` (``test_data`` or ``predict_data``), read and formatted once.

        Raises:
            SettingError: ``name`` is ``None`` (the message says what to pass).
        """
        source = getattr(self, name)
        if source is None:
            raise SettingError(
                f"{name} is None: trainer.{_HELD[name]} (lightning-grpo {_HELD[name]}) needs its prompts; pass "
                f"PromptDataModule({name}=...) (YAML: data.init_args.{name}): a .jsonl or .json file, "
                "'hf:<dataset>@<split>' or a list of dicts",
                name,
                None,
            )
        if self.train_records is None:
            self.setup(_HELD[name])
        if name not in self.held_records:
            rows = [self._format(row, f"{name} row {i}", i) for i, row in enumerate(self._load(source, None))]
            self.held_records[name] = self._without_long(rows, name)
        records = self.held_records[name]
        batch_size = self.val_batch_size or self.batch_size
        return DataLoader(records, **self._loader_options(records, batch_size, drop_last=False))

    def _without_long(self, rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
        """``rows`` less the prompts longer than ``max_prompt_length`` tokens, with one warning that counts them."""
        kept = rows if self.max_prompt_length is None else self._short_only(rows)
        if rows and not kept:
            raise ValueError(
                f"All {len(rows)} {name} prompts are longer than max_prompt_length={self.max_prompt_length} tokens; "
                "raise max_prompt_length or shorten the prompts"
            )
        if len(kept) < len(rows):
            rank_zero_warn(
                f"PromptDataModule dropped {len(rows) - len(kept)} of {len(rows)} {name} prompts longer than "
                f"max_prompt_length={self.max_prompt_length}"
            )
        return kept

    def _loader_options(self, records: list[dict[str, Any]], batch_size: int, *, drop_last: bool) -> dict[str, Any]:
        """DataLoader arguments shared by the loaders."""
        return {
            "batch_size": batch_size,
            "drop_last": drop_last,
            "collate_fn": partial(collate_prompts, columns=columns_of(records)),
            "num_workers": self.num_workers,
            "persistent_workers": self.num_workers > 0,
        }

    def _world(self) -> tuple[int, int]:
        """World size and global rank of the attached trainer (1 and 0 without one)."""
        if self.trainer is None:
            return 1, 0
        return getattr(self.trainer, "world_size", 1), getattr(self.trainer, "global_rank", 0)

    def _trained_in_epoch(self) -> int:
        """Batches of the current epoch trained so far (Lightning's count; 0 without a trainer)."""
        fit_loop = getattr(self.trainer, "fit_loop", None)  # no trainer attached: None
        if fit_loop is None:
            return 0
        return fit_loop.epoch_loop.batch_progress.current.processed  # a checkpoint is saved before "completed"

    def _resolve_from_module(self) -> None:
        """Fill ``tokenizer`` and ``max_prompt_length`` left as ``None`` from the attached LightningModule."""
        module = getattr(self.trainer, "lightning_module", None)  # no trainer attached: None
        if module is None:
            return
        if self.tokenizer is None:
            self.tokenizer = getattr(module, "tokenizer", None)
        if self.max_prompt_length is None:
            self.max_prompt_length = getattr(module, "max_prompt_length", None)
        self.tool_schemas = getattr(getattr(module, "agent", None), "tool_schemas", None)  # counted in prompt lengths

    def _check_prompts_fit_the_agent(self) -> None:
        """Refuse string prompts when the attached module has tools or an environment (they need chat messages)."""
        agent = getattr(getattr(self.trainer, "lightning_module", None), "agent", None)  # no trainer attached: None
        if not getattr(agent, "multi_turn", False):
            return
        for name, rows in (("train_data", self.train_records or []), ("val_data", self.val_records)):
            for position, row in enumerate(rows):
                if isinstance(row["prompt"], str):
                    raise string_prompts_refused(f"{name} row {getattr(row, 'index', position)}", row["prompt"])

    def _load(self, source: PromptSource, split: str | None) -> list[dict[str, Any]]:
        prompt_field = None if self.prompt_template is not None else self.prompt_field
        return load_records(source, prompt_field=prompt_field, split=split, hf_config=self.hf_config)

    def _format(self, row: dict[str, Any], where: str, index: int) -> dict[str, Any]:
        """The row with its prompt under ``"prompt"``: a text, or chat messages (conversational or ``chat_template``).

        Messages are kept as messages: the module renders them with the chat template when it samples. The row
        keeps its ``index``, which batches carry as the ``dataset_index`` column (errors about the row name it).
        """
        prompt = render_prompt(row, prompt_field=self.prompt_field, prompt_template=self.prompt_template, where=where)
        if self.chat_template or not isinstance(prompt, str):
            if self.tokenizer is not None and not getattr(self.tokenizer, "chat_template", None):
                raise ValueError(
                    f"{where}: conversational prompts (or chat_template=True) need a tokenizer with a chat template; "
                    f"{type(self.tokenizer).__name__} has none. Use an instruction-tuned model's tokenizer, or string "
                    "prompts with chat_template=False (a system_prompt is then prepended as plain text)"
                )
            prompt = as_messages(prompt, self.system_prompt)
        elif self.system_prompt:
            prompt = f"{self.system_prompt}\n{prompt}"
        return IndexedRow({**row, "prompt": prompt}, index=index)

    def _drop_long(self, train: list[dict], val: list[dict]) -> tuple[list[dict], list[dict]]:
        """Drop prompts longer than ``max_prompt_length`` tokens, with one warning that counts them."""
        if self.max_prompt_length is None:
            return train, val
        limit = self.max_prompt_length
        kept = [self._short_only(rows) for rows in (train, val)]
        dropped = len(train) + len(val) - len(kept[0]) - len(kept[1])
        if dropped:
            rank_zero_warn(
                f"PromptDataModule dropped {dropped} of {len(train) + len(val)} prompts longer than "
                f"max_prompt_length={limit} (train: {len(train) - len(kept[0])}, val: {len(val) - len(kept[1])})"
            )
        for name, before, after in (("train", train, kept[0]), ("val", val, kept[1])):
            if before and not after:
                raise ValueError(
                    f"All {len(before)} {name} prompts are longer than max_prompt_length={limit} tokens; "
                    "raise max_prompt_length or shorten the prompts"
                )
        return kept[0], kept[1]

    def _short_only(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        lengths = prompt_lengths(self.tokenizer, [row["prompt"] for row in rows], tools=self.tool_schemas)
        return [row for row, length in zip(rows, lengths, strict=True) if length <= self.max_prompt_length]


def _check_arguments(dm: PromptDataModule) -> None:
    """Check the constructor's arguments; each error names the argument and its allowed values."""
    val_split = dm.val_split
    check_number("val_split", val_split, minimum=0.0, maximum=1.0, exclusive_maximum=True)
    if val_split > 0 and dm.val_data is not None:
        raise ValueError(f"Pass either `val_data` or `val_split` (got val_split={val_split}), not both")
    if not isinstance(dm.prompt_field, str) or not dm.prompt_field:
        raise ValueError(f"`prompt_field` must be a non-empty column name, got {dm.prompt_field!r}")
    if dm.prompt_template is not None:
        if not isinstance(dm.prompt_template, str):
            raise ValueError(f"`prompt_template` must be a str.format template or None, got {dm.prompt_template!r}")
        template_fields(dm.prompt_template)  # fails early on a malformed or positional template
    check_source_path(dm.train_data, "train_data")  # now, not after the model is built
    for name in ("val_data", *_HELD):
        if getattr(dm, name) is not None:
            check_source_path(getattr(dm, name), name)
    check_number("batch_size", dm.batch_size, integer=True, minimum=1)
    check_number("num_workers", dm.num_workers, integer=True, minimum=0)
    for name in ("val_batch_size", "max_prompt_length"):
        check_number(name, getattr(dm, name), integer=True, minimum=1, allow_none=True)
