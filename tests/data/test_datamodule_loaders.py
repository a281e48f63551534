"""PromptDataModule: validation split, dataloaders (batching, shuffling, DDP samplers) and a real Trainer run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DistributedSampler

from lightning_grpo.data import PromptDataModule
from lightning_grpo.testing import make_task

ADDITION = make_task("addition", num_samples=20, seed=0)
UNIQUE = [{"prompt": f"p{i}=", "answer": str(i)} for i in range(10)]


def attach(dm: PromptDataModule, module=None, world_size: int = 1) -> None:
    """A stand-in for the Trainer: the datamodule reads only these two attributes."""
    dm.trainer = SimpleNamespace(lightning_module=module, world_size=world_size)


# --- validation split ---------------------------------------------------------------------------------------------


def test_val_split_is_seeded_and_disjoint():
    def split(seed):
        dm = PromptDataModule(make_task("addition", num_samples=40), val_split=0.25, seed=seed)
        dm.setup("fit")
        return dm.train_records, dm.val_records

    train, val = split(0)
    assert len(train) == 30 and len(val) == 10
    assert split(0) == (train, val)
    assert split(1) != (train, val)
    assert sorted(map(str, train + val)) == sorted(map(str, make_task("addition", num_samples=40)))


def test_val_split_too_large_for_the_data():
    with pytest.raises(ValueError, match="leaves no training records"):
        PromptDataModule(ADDITION[:1], val_split=0.5).setup("fit")


def test_val_data_hf_source_must_name_its_split():
    dm = PromptDataModule(ADDITION, val_data="hf:openai/gsm8k")
    with pytest.raises(ValueError, match=r"name the split to use, e.g. 'hf:openai/gsm8k@test'"):
        dm.setup("fit")


# --- dataloaders --------------------------------------------------------------------------------------------------


def test_train_loader_drops_the_last_incomplete_batch():
    dm = PromptDataModule(UNIQUE, batch_size=4)
    batches = list(dm.train_dataloader())
    assert len(dm.train_dataloader()) == 2 and [len(b["prompt"]) for b in batches] == [4, 4]
    prompts = [p for b in batches for p in b["prompt"]]
    assert len(set(prompts)) == 8 and set(prompts) <= {r["prompt"] for r in UNIQUE}
    for b in batches:  # columns stay aligned row by row
        assert [f"p{a}=" for a in b["answer"]] == b["prompt"]


def test_train_loader_shuffle_is_seeded():
    def order(seed, shuffle=True):
        dm = PromptDataModule(make_task("addition", num_samples=32), batch_size=8, seed=seed, shuffle=shuffle)
        return [p for b in dm.train_dataloader() for p in b["prompt"]]

    assert order(0) == order(0)
    assert order(0) != order(1)
    assert order(0, shuffle=False) == [r["prompt"] for r in make_task("addition", num_samples=32)]


def test_fewer_records_than_batch_size_is_an_error():
    with pytest.raises(ValueError, match=r"3 training prompts are fewer than batch_size=4 x world_size=1"):
        PromptDataModule(ADDITION[:3], batch_size=4).train_dataloader()
    dm = PromptDataModule(ADDITION[:6], batch_size=4)
    attach(dm, world_size=2)
    with pytest.raises(ValueError, match=r"6 training prompts are fewer than batch_size=4 x world_size=2"):
        dm.train_dataloader()


def test_val_loader_keeps_every_prompt_in_order():
    dm = PromptDataModule(ADDITION, val_data=ADDITION[:10], batch_size=8, val_batch_size=4)
    batches = list(dm.val_dataloader())
    assert [len(b["prompt"]) for b in batches] == [4, 4, 2]
    assert [p for b in batches for p in b["prompt"]] == [r["prompt"] for r in ADDITION[:10]]


def test_val_loader_is_empty_without_validation_data():
    assert PromptDataModule(ADDITION).val_dataloader() == []


def _fake_trainer(world_size: int, rank: int, completed: int = 0):
    progress = SimpleNamespace(current=SimpleNamespace(processed=completed))
    fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress))
    return SimpleNamespace(world_size=world_size, global_rank=rank, fit_loop=fit_loop, lightning_module=None)


def test_every_rank_gets_its_own_prompts_and_the_same_number_of_full_batches():
    per_rank = []
    for rank in range(2):
        dm = PromptDataModule(ADDITION[:19], batch_size=4)
        dm.trainer = _fake_trainer(2, rank)
        loader = dm.train_dataloader()
        assert isinstance(loader.sampler, DistributedSampler)  # Lightning keeps it instead of wrapping it
        per_rank.append([p for batch in loader for p in batch["prompt"]])
    assert [len(prompts) for prompts in per_rank] == [8, 8]  # 10 samples per rank (padded), 2 full batches of 4
    seen = [ADDITION.index(next(r for r in ADDITION if r["prompt"] == p)) for p in per_rank[0]]
    assert len(seen) == 8


def test_order_depends_on_seed_and_epoch_and_resumes_mid_epoch():
    dm = PromptDataModule(ADDITION[:16], batch_size=4, seed=3)
    loader = dm.train_dataloader()
    epochs = []
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        epochs.append([p for batch in loader for p in batch["prompt"]])
    assert epochs[0] != epochs[1] and sorted(epochs[0]) == sorted(epochs[1])
    stopped = PromptDataModule(ADDITION[:16], batch_size=4, seed=3)
    stopped.trainer = _fake_trainer(1, 0, completed=3)  # 3 of 4 batches trained when the checkpoint is taken
    loader = stopped.train_dataloader()
    loader.sampler.set_epoch(1)
    batches = iter(loader)
    [next(batches) for _ in range(4)]  # the 4th was handed out (e.g. prefetched) but not trained
    state = loader.state_dict()  # what Lightning saves in the checkpoint's fit loop state
    resumed = PromptDataModule(ADDITION[:16], batch_size=4, seed=3).train_dataloader()
    resumed.load_state_dict(state)  # what Lightning does on resume, before the epoch starts
    resumed.sampler.set_epoch(1)
    assert [p for batch in resumed for p in batch["prompt"]] == epochs[1][12:]


def test_the_training_loader_is_resumable_in_lightnings_sense():
    from lightning.fabric.utilities.types import _Stateful  # what Lightning's fit loop checks before warning

    loader = PromptDataModule(ADDITION[:16], batch_size=4).train_dataloader()
    assert isinstance(loader, _Stateful)


def test_workers_collate_the_same_batches():
    dm = PromptDataModule(ADDITION, batch_size=5, num_workers=1, shuffle=False)
    assert list(dm.train_dataloader()) == list(
        PromptDataModule(ADDITION, batch_size=5, shuffle=False).train_dataloader()
    )


# --- with a real Trainer ------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Total length of `list` across ranks is zero")  # Lightning, val_dataloader() == []
@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated")  # Lightning vs torch 2.13
@pytest.mark.parametrize("val_split", [0.0, 0.2])
def test_fit_with_a_trainer_feeds_batches_and_takes_module_settings(tokenizer, val_split):
    from lightning.pytorch import LightningModule, Trainer

    class Recorder(LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.tokenizer, self.max_prompt_length = tokenizer, 4
            self.layer = torch.nn.Linear(1, 1)
            self.train_batches, self.val_batches = [], []

        def training_step(self, batch, batch_idx):
            self.train_batches.append(batch)

        def validation_step(self, batch, batch_idx):
            self.val_batches.append(batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    rows = [*ADDITION, {"prompt": "10+10=", "answer": "20"}]
    dm = PromptDataModule(rows, val_split=val_split, batch_size=4)
    module = Recorder()
    trainer = Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    with pytest.warns(UserWarning, match="dropped 1 of 21"):
        trainer.fit(module, datamodule=dm)
    assert dm.tokenizer is tokenizer and dm.max_prompt_length == 4
    assert len(module.train_batches) == len(dm.train_records) // 4
    assert sum(len(b["prompt"]) for b in module.val_batches) == len(dm.val_records) == round(20 * val_split)
    assert all(set(b) == {"prompt", "answer", "dataset_index"} for b in module.train_batches + module.val_batches)


# --- docs ---------------------------------------------------------------------------------------------------------


def test_class_docstring_example_runs():
    doc = PromptDataModule.__doc__
    example = doc.split("Example::", 1)[1]
    lines = [line[8:] for line in example.splitlines() if line.strip()]
    exec("\n".join(lines), {})
