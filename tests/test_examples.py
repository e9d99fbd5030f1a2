"""Built-in examples: the synthetic task is deterministic, balanced and learnable; recipes load."""

import pickle

import pytest
import torch
from torch.utils.data import DataLoader

from elastic_tasks.examples import EXAMPLES, SyntheticClassification, SyntheticSpec, count_params
from elastic_tasks.examples.models import MLP, AlexNetish, ResNetish, VGGish
from elastic_tasks.recipe import TrainingRecipe, load_entry_point


@pytest.fixture(autouse=True)
def one_thread():
    # Two intra-op threads on a loaded 2-core machine stall on each other (measured 3 s -> 125 s).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_same_index_same_sample_across_instances_and_pickling():
    spec = SyntheticSpec((3, 16, 16), 10, seed=3)
    a = SyntheticClassification(spec, 100)
    b = pickle.loads(pickle.dumps(SyntheticClassification(spec, 500)))
    for i in (0, 7, 99):
        xa, ya = a[i]
        xb, yb = b[i]
        assert torch.equal(xa, xb) and int(ya) == int(yb)
    assert not torch.equal(a[0][0], a[1][0])


def test_splits_and_seeds_differ():
    spec = SyntheticSpec((32,), 4, seed=0)
    train = SyntheticClassification(spec, 10)
    evals = train.other_split("eval", 10)
    other = SyntheticClassification(SyntheticSpec((32,), 4, seed=1), 10)
    assert not torch.equal(train[0][0], evals[0][0])
    assert not torch.equal(train[0][0], other[0][0])


@pytest.mark.parametrize("shape,classes", [((3, 16, 16), 10), ((32,), 4)])
def test_classes_roughly_balanced(shape, classes):
    counts = SyntheticClassification(SyntheticSpec(shape, classes), 4000).label_counts(1000)
    expected = 1000 / classes
    assert min(counts) > 0.5 * expected and max(counts) < 1.5 * expected, counts


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"shape": (3, 2, 2), "num_classes": 4}, "shape"),
        ({"shape": (0,), "num_classes": 4}, "shape"),
        ({"shape": (8,), "num_classes": 1}, "num_classes"),
        ({"shape": (8,), "num_classes": 4, "seed": -1}, "seed"),
    ],
)
def test_bad_spec_names_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SyntheticSpec(**kwargs)


def test_bad_dataset_arguments():
    spec = SyntheticSpec((8,), 2)
    with pytest.raises(ValueError, match="size"):
        SyntheticClassification(spec, 0)
    with pytest.raises(ValueError, match="split"):
        SyntheticClassification(spec, 4, "test")
    with pytest.raises(IndexError):
        SyntheticClassification(spec, 4)[4]


def test_bad_model_width():
    for cls in (ResNetish, AlexNetish, VGGish):
        with pytest.raises(ValueError, match="width"):
            cls(width=0)
    with pytest.raises(ValueError, match="hidden"):
        MLP(hidden=-1)


@pytest.mark.parametrize("name", ["mlp_tiny", "resnet_small", "alexnet_small", "vgg_small"])
def test_small_entry_points_load_and_run(name):
    recipe = load_entry_point(f"elastic_tasks.examples:{name}")
    assert isinstance(recipe, TrainingRecipe) and recipe.name == name
    model = recipe.build_model()
    assert count_params(model) < 300_000
    x, y = next(iter(DataLoader(recipe.dataset, batch_size=4)))
    loss = recipe.loss_fn(model(x), y)
    loss.backward()
    opt = recipe.make_optimizer(model.parameters(), recipe.base_lr)
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] > 0
    opt.step()
    assert recipe.eval_dataset is not None and len(recipe.eval_dataset) > 0
    pickle.dumps(recipe)  # recipes travel to Dask workers


@pytest.mark.parametrize("name", ["resnet_10m", "alexnet_10m", "vgg_10m"])
def test_benchmark_models_are_about_ten_million_parameters(name):
    assert 8_000_000 <= count_params(EXAMPLES[name]().build_model()) <= 12_000_000


def _train_and_eval(recipe: TrainingRecipe, steps: int) -> float:
    torch.manual_seed(0)
    model = recipe.build_model()
    opt = recipe.make_optimizer(model.parameters(), recipe.base_lr)
    loader = DataLoader(recipe.dataset, batch_size=recipe.base_batch, shuffle=True, generator=torch.Generator().manual_seed(0))
    done = 0
    model.train()
    while done < steps:
        for x, y in loader:
            loss = recipe.loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
            if done == steps:
                break
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in DataLoader(recipe.eval_dataset, batch_size=256):
            correct += int((model(x).argmax(dim=1) == y).sum())
            total += len(y)
    return correct / total


def test_mlp_tiny_learns_the_teacher():
    # chance is 0.25 (4 balanced classes); measured ~0.84 after 200 steps
    assert _train_and_eval(EXAMPLES["mlp_tiny"](), steps=200) > 0.6


def test_vgg_small_learns_the_teacher():
    # chance is 0.10 (10 balanced classes); measured ~0.47 after 300 steps
    assert _train_and_eval(EXAMPLES["vgg_small"](), steps=300) > 0.3


def test_samples_do_not_depend_on_the_thread_count():
    # Ranks may run with different intra-op thread counts; their shards must still agree.
    spec = SyntheticSpec((3, 16, 16), 10, seed=5)
    one = SyntheticClassification(spec, 200)
    samples_one = [one[i] for i in range(200)]
    torch.set_num_threads(2)
    two = SyntheticClassification(spec, 200)
    for i, (x, y) in enumerate(samples_one):
        x2, y2 = two[i]
        assert torch.equal(x, x2) and int(y) == int(y2), i
