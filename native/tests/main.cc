// main.cc — the native core's unit tests (doctest): built with native/src/*.cc but bindings.cc,
// no Python and no torch, and run by tests/native/test_native_core.py as part of the project's
// test command.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
