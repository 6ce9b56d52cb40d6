# A stand-in for starlette-context, which this machine's package index does not
# hold: llama-cpp-python's server (llama_cpp/server/app.py) only mounts its
# request-id middleware, which does nothing to inference; this one passes every
# request through. Put on the server child's PYTHONPATH by
# tests/test_endpoint_server.py only where the real package is absent.
