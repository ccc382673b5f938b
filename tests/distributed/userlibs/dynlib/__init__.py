"""A stand-in for a modelling library that builds its model classes at import time (as Inference Gym does).

``dynlib.using_jax`` creates the modules ``dynlib.dynamic.base`` and ``dynlib.dynamic.targets``; a
process that has not imported it cannot unpickle their classes.
"""
