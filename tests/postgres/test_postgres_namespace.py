"""aiopurgatory.postgres shows its public API only, documented in docs/api.md (as the
core's tests check the other public modules: these need the postgres extra)."""

from __future__ import annotations

import pickle

import pytest

from tests.core import test_namespace
from tests.docs import test_docs


@pytest.mark.parametrize("module_name", ["aiopurgatory.postgres", "aiopurgatory.postgres.testing"])
def test_the_public_api_is_listed_and_documented(
    module_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(test_namespace.SUBMODULES, "aiopurgatory.postgres", {"testing"})
    test_namespace.test_dir_lists_the_public_api_only(module_name)
    test_docs.test_api_reference_documents_every_public_name(module_name)


def test_errors_name_their_public_module_and_pickle() -> None:
    from aiopurgatory.postgres import PostgresTriggersClosedError, PostgresTriggersError

    for error in (PostgresTriggersError, PostgresTriggersClosedError):
        assert error.__module__ == "aiopurgatory.postgres"
        assert type(pickle.loads(pickle.dumps(error("x")))) is error
