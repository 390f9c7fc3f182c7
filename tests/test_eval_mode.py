"""`eval_mode`: the block runs without dropout and the model's own mode comes back, even after an error."""

import pytest
import torch
from torch import nn

from world_model.evaluation.evaluate import evaluation_sums
from world_model.models.four_tensor import FourTensorModel
from world_model.models.four_tensor_config import FourTensorConfig
from world_model.utils.eval_mode import eval_mode


@pytest.mark.parametrize("training", [True, False])
def test_eval_mode_restores_the_models_mode_after_the_block_and_after_an_error(training):
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)).train(training)
    with eval_mode(model) as inside:
        assert inside is model and not model.training and not model[1].training
    assert model.training is training and model[1].training is training
    with pytest.raises(RuntimeError, match="boom"), eval_mode(model):
        raise RuntimeError("boom")
    assert model.training is training and model[1].training is training


def test_evaluation_is_dropout_free_and_leaves_a_training_model_training():
    torch.manual_seed(0)
    config = FourTensorConfig(vocab_size=12, d_x=4, d_t=2, n_heads=1, n_layers=1, n_tokens=4, n_states=2, dropout=0.5)
    model = FourTensorModel(config).train()
    windows = torch.randint(2, 12, (6, 3, 4))
    first, second = evaluation_sums(model, windows, batch_size=4), evaluation_sums(model, windows, batch_size=4)
    assert torch.equal(first, second) and model.training
