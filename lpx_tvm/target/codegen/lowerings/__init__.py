"""The lowering of each op family, one module each; importing this package imports every
module in it, which registers its lowerings (and any patterns it declares) in
:mod:`..registry`. A new op family is one new module here: nothing lists it."""

import importlib
import pkgutil

FAMILIES = tuple(importlib.import_module(f"{__name__}.{m.name}")
                 for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name))
