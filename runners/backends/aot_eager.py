"""aot_eager: Dynamo and AOTAutograd, run eagerly; it checks functionalisation and needs nothing but torch."""
from graphmode.runners.backends.base import Backend, register


@register
class AotEager(Backend):
    name = "aot_eager"
    summary = "Dynamo + AOTAutograd, run eagerly: checks functionalisation"
    listing_order = 1
    auto_preference = 3  # the last resort of `auto`: it runs wherever torch does
    # The probe's first stage already is aot_eager.
    backend_stage_same_as = "aot_eager"
