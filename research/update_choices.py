"""Update places chosen by hand, for rows and tests that compare them with the
default's choice (:func:`tfswap.tf.update_places.choose`).

Example::

    update_places.choose = every_update_on_the_host     # the ZeRO-Offload row
"""

from tfswap.core.plan import UpdatePlace
from tfswap.tf import host_side, update_places


def every_update_on_the_host(captured, prof, device, room, price):
    """``update_places.choose`` (same arguments) placing every update group on the
    host: the update computed once there after the all-reduce."""
    places = []
    for group in host_side.update_groups(captured, device):
        # Placing one group rewrites the graph: the next is found again in it.
        current = next(g for g in host_side.update_groups(captured, device)
                       if g.variables == group.variables)
        captured, prof = update_places.place(captured, prof, device, current, "host")
        places.append(UpdatePlace(current.variables, "host", 0, "every update on the host"))
    return update_places.Placed(captured, prof, tuple(places))
