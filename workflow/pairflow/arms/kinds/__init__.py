"""One module per kind of arm; each defines ``KIND``, an ``arms.base.ArmKind`` instance.
``arms.registry`` finds them here: a new kind is a new module in this folder."""
