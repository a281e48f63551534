"""In-process checks of the distributed glue: FSDP1 is refused at setup, the gradient scale, the decoder layers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy, SingleDeviceStrategy

from lightning_grpo.distributed import FSDP2_STRATEGY_CONFIG, decoder_layers, grad_scale, is_sharded
from lightning_grpo.testing import build_tiny_model
from tests.conftest import make_trainer, prompt_loader


def test_dist_fsdp1_is_refused_at_setup_naming_the_fsdp2_config(make_module):
    module = make_module()
    module.trainer = SimpleNamespace(strategy=FSDPStrategy())  # Lightning builds FSDP1 only on GPUs
    with pytest.raises(ValueError, match="FSDPStrategy") as error:
        module.setup("fit")
    message = str(error.value)
    assert FSDP2_STRATEGY_CONFIG in message
    assert "manual optimization" in message and "19685" in message


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Lightning's FSDPStrategy needs a GPU")
def test_dist_fsdp1_fit_fails_at_setup(make_module):
    trainer = make_trainer(accelerator="gpu", strategy="fsdp", max_steps=1)
    try:
        with pytest.raises(ValueError, match="ModelParallelStrategy"):
            trainer.fit(make_module(), prompt_loader(["1+1="]))
    finally:
        if torch.distributed.is_initialized():  # a one-process group the strategy set up in this process
            torch.distributed.destroy_process_group()


def test_dist_grad_scale_is_the_world_size_under_data_parallel_strategies():
    assert grad_scale(DDPStrategy(), 4) == 4.0
    assert grad_scale(ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1), 2) == 2.0
    assert grad_scale(SingleDeviceStrategy(torch.device("cpu")), 1) == 1.0
    assert grad_scale(None, 1) == 1.0


def test_dist_single_process_module_is_untouched(make_module):
    module = make_module()
    module.configure_model()  # no trainer: nothing to shard
    assert not is_sharded(module.policy) and not module.export_adapter_all_ranks
    assert module.iteration_context().grad_scale == 1.0 and not module.sampling_settings().synced_gpus


def test_dist_decoder_layers_are_the_models_no_split_modules(tokenizer):
    model = build_tiny_model(tokenizer, num_layers=3)
    assert decoder_layers(model) == list(model.model.layers)
    with pytest.raises(ValueError, match="cannot find the decoder layers"):
        decoder_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)))
