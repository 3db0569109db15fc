"""Hub search by text and file choice inside a repository, against a fake HfApi (the
tests have no network); offline gives one sentence."""

from __future__ import annotations

from types import SimpleNamespace

import huggingface_hub
import pytest

from gui import hub
from gui.hub import OFFLINE, quant_of
from tests.gui.conftest import job_result

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"


class FakeApi:
    calls: list = []

    def list_models(self, *, search, sort, limit, full):  # noqa: ANN001, ANN201
        FakeApi.calls.append(("list_models", search, sort, limit))
        return iter([
            SimpleNamespace(id=REPO, downloads=123_456, likes=40, tags=["gguf", "llama"]),
            SimpleNamespace(id="someone/smollm2-notes", downloads=0, likes=0, tags=None),
        ])

    def model_info(self, repo_id, files_metadata):  # noqa: ANN001, ANN201
        FakeApi.calls.append(("model_info", repo_id, files_metadata))
        files = [("README.md", 2_000), ("smollm2-135m-instruct-q8_0.gguf", 145_000_000),
                 ("smollm2-135m-instruct-Q4_K_M.gguf", 105_000_000),
                 ("smollm2-135m-instruct-f16.gguf", 271_000_000)]
        return SimpleNamespace(siblings=[SimpleNamespace(rfilename=n, size=s)
                                         for n, s in files])


class OfflineApi:
    def list_models(self, **_kw):  # noqa: ANN003, ANN201
        import httpx

        raise httpx.ConnectError("[Errno -3] Temporary failure in name resolution")

    model_info = list_models


def test_quant_type_from_file_names() -> None:
    assert quant_of("smollm2-135m-instruct-q8_0.gguf") == "Q8_0"
    assert quant_of("Qwen3-0.6B-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_of("model.IQ4_XS.gguf") == "IQ4_XS"
    assert quant_of("model-f16.gguf") == "F16"
    assert quant_of("model.safetensors") == ""


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> type[FakeApi]:
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    monkeypatch.setattr(hub, "_check_dns", lambda _what: None)
    FakeApi.calls = []
    return FakeApi


def test_search_pick_a_repo_and_a_file_in_the_window(make_window, qtbot, fake_hub) -> None:
    w = make_window()
    box = w.picker.download_box
    with job_result(qtbot, w.downloads, "search", timeout=30_000):
        box.query.setText("  smollm2   gguf ")
        box.search_button.click()
    assert fake_hub.calls[0] == ("list_models", "smollm2 gguf", "downloads", hub.SEARCH_LIMIT)
    assert box.results.rowCount() == 2 and box.search_split.isVisibleTo(w)
    assert [box.results.item(0, c).text() for c in range(3)] == [REPO, "123K", "gguf"]
    assert box.results.item(1, 2).text() == "—"
    with job_result(qtbot, w.downloads, "list_repo", timeout=30_000):
        box.results.selectRow(0)
    assert fake_hub.calls[-1] == ("model_info", REPO, True)
    assert box.repo.text() == REPO
    rows = [[box.files.item(r, c).text() for c in range(3)] for r in range(box.files.rowCount())]
    assert rows == [["smollm2-135m-instruct-Q4_K_M.gguf", "Q4_K_M", "100.1 MiB"],
                    ["smollm2-135m-instruct-q8_0.gguf", "Q8_0", "138.3 MiB"],
                    ["smollm2-135m-instruct-f16.gguf", "F16", "258.4 MiB"]]  # no README
    box.files.selectRow(1)
    assert box.filename.text() == "smollm2-135m-instruct-q8_0.gguf"  # ready to download


def test_offline_search_says_so_in_one_sentence(make_window, qtbot, monkeypatch) -> None:
    monkeypatch.setattr(huggingface_hub, "HfApi", OfflineApi)
    monkeypatch.setattr(hub, "_check_dns", lambda _what: None)
    w = make_window()
    box = w.picker.download_box
    with qtbot.waitSignal(w.downloads.failed, timeout=30_000) as failed:
        assert box.search("smollm2")
    assert failed.args[0] == "search" and failed.args[1].startswith(OFFLINE)
    assert box.status.text().startswith(OFFLINE) and "Traceback" not in box.status.text()
    with pytest.raises(hub.HubUnreachableError, match="cannot be reached"):
        hub.repo_files(REPO, api=OfflineApi())
