"""The SDK's core: the coordinator client, the worker, errors and retries, layouts,
buckets and the dataset state, CUDA hand-offs, and the training loop's elastic side.
"""
