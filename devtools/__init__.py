"""Harnesses the tests and the benchmarks share; no production module imports this package.

    devtools.stack           boot and stop ``manage.py runstack`` (end-to-end tests, bench)
    devtools.browser         daphne + a driver process + headless Chromium (browser tests, bench/live)
    devtools.browser_driver  the driver process: changes jobs through the real services
    devtools.job_steps       move a job along its lifecycle through the production door
    devtools.elastic         real multi-process elastic jobs and their checks
    devtools.measured        replay a measured run in the simulator (bench/sim_vs_real)
    devtools.s3_server       an S3-compatible server on loopback (moto)

It sits above every package in ``tests/architecture/imports.py``'s LAYERS (it may
import any of them; none may import it), and neither it, ``bench/`` nor a
production package may import ``tests`` or a package's ``tests``: the harnesses
live here so that both sides import them from one place.
"""
