"""Generated message modules and dict <-> message conversion.

Every public function of the package that takes a spec, layout or placement
accepts either the proto message or a plain dict in the protobuf JSON mapping
(camelCase or snake_case field names, enum values by name).
"""

from google.protobuf import json_format

from reshard.v1 import agent_pb2  # noqa: F401  (re-exported)
from reshard.v1 import coordinator_pb2, coordinator_pb2_grpc  # noqa: F401
from reshard.v1 import plan_pb2  # noqa: F401
from reshard.v1 import ptc_pb2
from reshard.v1 import worker_pb2, worker_pb2_grpc  # noqa: F401

__all__ = ["agent_pb2", "coordinator_pb2", "coordinator_pb2_grpc", "plan_pb2", "ptc_pb2",
           "worker_pb2", "worker_pb2_grpc", "as_message", "to_dict"]


def as_message(value, cls, what="value"):
    """`value` as a `cls` message: a `cls` is copied, a dict is parsed."""
    if isinstance(value, cls):
        out = cls()
        out.CopyFrom(value)
        return out
    if isinstance(value, dict):
        try:
            return json_format.ParseDict(value, cls())
        except json_format.ParseError as e:
            raise ValueError(f"{what}: not a {cls.DESCRIPTOR.full_name} in the proto JSON "
                             f"mapping: {e}") from None
    raise TypeError(f"{what}: expected {cls.DESCRIPTOR.full_name} or dict, "
                    f"got {type(value).__name__}")


def to_dict(message):
    """A message as a dict in the proto JSON mapping (camelCase, enums by name)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=False)
