"""The quickstart's job (train.py) as the tests see it: its configured
DatasetState, and its uninterrupted one-process run, the reference every
reconfigured run's losses are compared with."""
from reshard import data

import tiny_transformer as my


def dataset():
    """train.py's configured DatasetState."""
    return data.DatasetState(data.DatasetDescriptor("tokens", my.NUM_SAMPLES, "v1"),
                             data.Order(seed=5, shuffle="full"), global_batch=my.GLOBAL_BATCH)


def run(steps):
    """`steps` steps of one process, no parallelism. Returns (the loss of
    each step, the model, the optimizer)."""
    model = my.build()
    opt = my.optimizer(model)
    state, losses = dataset(), []
    for _ in range(steps):
        sh = state.share(1, 0)
        losses.append(my.train_step(model, opt, state.samples(sh.begin, sh.end)))
        state = state.advanced()
    return losses, model, opt
