"""The coordinator's apps share one set of routes a process (:func:`coordinator.app.api_routes`): they must
document and serve the API as including each router into each app would, each from its own ledger."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from intellect_protocol.coordinator.app import ROUTERS, create_app
from intellect_protocol.coordinator.settings import CoordinatorSettings
from tests.conftest import LIFTED, serve
from tests.helpers import HTTP


@pytest.mark.unit
def test_the_shared_routes_document_the_api_as_including_each_router_does(sqlite_url: str, tmp_path: Path) -> None:
    app = create_app(CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs"))
    included = FastAPI(title=app.title, version=app.version, description=app.description)
    for module in ROUTERS:
        included.include_router(module.router)
    assert app.openapi() == included.openapi()
    ours = [(r.path, r.methods) for r in app.routes if isinstance(r, APIRoute)]
    assert ours == [(r.path, r.methods) for r in included.routes if isinstance(r, APIRoute)] and len(ours) > 50


def test_two_apps_of_one_process_each_answer_from_their_own_ledger(sqlite_url: str, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "ledger.db").write_bytes(Path(sqlite_url.removeprefix("sqlite:///")).read_bytes())
    with serve(CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "a", **LIFTED)) as a:
        with serve(
            CoordinatorSettings(
                database_url=f"sqlite:///{other / 'ledger.db'}", blob_dir=tmp_path / "b", audience="other", **LIFTED
            )
        ) as b:
            assert a.audience != b.audience == "other"
            for served in (a, b, a):
                assert HTTP.get(f"{served.url}/v1/public/status").json()["audience"] == served.audience
