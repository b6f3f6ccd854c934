"""eager: Dynamo captures the graphs and runs them eagerly; it checks tracing only."""
from graphmode.runners.backends.base import Backend, register


@register
class Eager(Backend):
    name = "eager"
    summary = "Dynamo capture, graphs run eagerly: checks tracing only"
    listing_order = 0
