"""The web console in a real browser: Debian's headless Chromium driven through Debian's
chromedriver by Selenium, against a real service on a real Redis, on a closed network (every
host but 127.0.0.1 unresolvable; the test also fails on any request to another origin).

Screenshots of each page are saved under ``build/screenshots/console/`` (git-ignored) for a
person to look at.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from service.security import entry_for
from tests.service.support import (
    ROOT,
    Launch,
    RedisServer,
    ServiceProcess,
    chromium_flags,
    make_model,
    stream,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
SHOTS = ROOT / "build" / "screenshots" / "console"

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="chromium and chromium-driver are not installed (.ci/run installs Debian's "
    "chromium and chromium-driver when run as root)",
)

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the test extra)")
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

KEYS = {"admin": "console-admin-key", "query": "console-query-key"}
DIM = 6
#: Generous: a loaded machine with several browsers and services on two cores.
WAIT_S = 90.0


@pytest.fixture
def browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WebDriver]:
    monkeypatch.setenv("SE_OFFLINE", "true")  # selenium-manager must never download anything
    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in (*chromium_flags(tmp_path / "profile"), "--window-size=1280,2200"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        driver.set_script_timeout(30)
        yield driver
    finally:
        driver.quit()


def wait_for(what: str, check: Callable[[], Any], timeout: float = WAIT_S) -> Any:
    """Poll ``check`` until it returns something truthy; its value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as exc:  # the element is not there yet, a stale reference
            last = exc
        else:
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def data(driver: WebDriver, element_id: str, attribute: str) -> str | None:
    value = driver.find_element(By.ID, element_id).get_attribute(f"data-{attribute}")
    return None if value is None else str(value)


def feed(client: httpx.Client, name: str, X: np.ndarray, y: list[str], **headers: str) -> int:
    body = {"samples": [{"x": x, "y": k} for x, k in zip(X.tolist(), y, strict=True)]}
    answer = client.post(f"/v1/models/{name}/samples?wait=true", json=body, headers=headers)
    assert answer.status_code == 200, answer.text
    version: int = answer.json()["version"]
    return version


def shot(driver: WebDriver, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(SHOTS / f"{name}.png"))


def requests_made(driver: WebDriver) -> list[str]:
    """Every URL the page requested (the DevTools performance log)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
        elif message["method"] == "Network.webSocketCreated":
            urls.append(message["params"]["url"])
    return urls


def assert_same_origin(driver: WebDriver, svc: ServiceProcess) -> None:
    """Every network request went to the service (``chrome://`` pages of the browser's own
    start-up are not network requests)."""
    network = [u for u in requests_made(driver) if u.startswith(("http", "ws"))]
    assert any(u.startswith(svc.url + "/ui/") for u in network)
    assert any(u.startswith(svc.ws_url + "/v1/") for u in network)  # the /events socket
    others = [u for u in network if not u.startswith((svc.url + "/", svc.ws_url + "/"))]
    assert others == []


def assert_no_page_errors(driver: WebDriver) -> None:
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == []


#: Counts the pixels of each class colour on the scatter's canvas (colours as the page's
#: ``data-colours`` lists them), i.e. what the library really drew.
COUNT_COLOURS = """
const el = document.getElementById(arguments[0]);
const canvas = el.querySelector("canvas");
const ctx = canvas.getContext("2d");
const px = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
const hex = (h) => [1, 3, 5].map((i) => parseInt(h.slice(i, i + 2), 16));
const want = el.dataset.colours.split(",").map(hex);
const counts = want.map(() => 0);
for (let p = 0; p < px.length; p += 4) {
  want.forEach(([r, g, b], k) => {
    const near = Math.abs(px[p] - r) + Math.abs(px[p + 1] - g) + Math.abs(px[p + 2] - b);
    if (near < 12) counts[k]++;
  });
}
return counts;
"""

#: Where sample ``i`` of the picture is drawn, relative to the centre of the plotting area.
POINT_OFFSET = """
const u = document.getElementById(arguments[0]).uplot;
const r = u.over.getBoundingClientRect();
return [u.valToPos(arguments[1], "x") - r.width / 2, u.valToPos(arguments[2], "y") - r.height / 2];
"""


def click_sample(driver: WebDriver, chart: str, point: list[float]) -> None:
    dx, dy = driver.execute_script(POINT_OFFSET, chart, point[0], point[1])
    over = driver.find_element(By.CSS_SELECTOR, f"#{chart} .u-over")
    ActionChains(driver).move_to_element_with_offset(over, round(dx), round(dy)).click().perform()


def test_console_shows_a_model_live_and_its_answers_are_the_apis(
    launch: Launch, own_redis: RedisServer, tmp_path: Path, browser: WebDriver
) -> None:
    svc = launch(tmp_path / "svc", own_redis.url).start()
    name = "faces"
    X, y = stream(150, DIM, 3, seed=11)
    with svc.client() as client:
        make_model(client, name, DIM)
        assert feed(client, name, X[:90], y[:90]) == 90
        items = [{"id": f"p{i}", "x": X[i].tolist(), "y": y[i]} for i in range(6)]
        assert client.post(f"/v1/models/{name}/gallery", json={"items": items}).status_code < 300

        # the models table lists the model with its state
        browser.get(svc.url + "/ui/")
        row = wait_for(
            "the model's row",
            lambda: browser.find_element(By.CSS_SELECTOR, f'tr[data-model="{name}"]'),
        )
        cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
        assert cells[:6] == [name, "copml", str(DIM), "90", "90", "3"]
        assert data(browser, "scopes", "scopes") == "query ingest admin"  # no keys configured
        shot(browser, "models")

        # the model's page: every chart filled from the API, as of version 90
        row.find_element(By.LINK_TEXT, name).click()
        wait_for("version 90", lambda: data(browser, "counters", "version") == "90")
        wait_for("the picture of 90 samples", lambda: data(browser, "picture-z", "points") == "90")
        assert data(browser, "picture-x", "points") == "90"
        curve = client.get(f"/v1/models/{name}/calibration", params={"points": 50}).json()
        wait_for("the ROC", lambda: data(browser, "roc", "version") == "90")
        roc_series = (data(browser, "roc", "series") or "").split(",")
        assert roc_series[:2] == [str(len(curve["points"])), "1"]  # the curve and the threshold
        wait_for("a progress point", lambda: data(browser, "progress", "last") == "90")
        progress_before = int(data(browser, "progress", "points") or 0)
        assert progress_before >= 1
        assert data(browser, "picture-z", "classes") == "3"
        counts = browser.execute_script(COUNT_COLOURS, "picture-z")
        assert len(counts) == 3 and min(counts) > 20, counts  # three colours, each drawn
        browser.execute_script("window.__sameDocument = true;")

        # more samples: the page follows without a reload
        assert feed(client, name, X[90:], y[90:]) == 150
        wait_for("version 150", lambda: data(browser, "counters", "version") == "150")
        wait_for("the picture of 150", lambda: data(browser, "picture-z", "points") == "150")
        wait_for("the progress point at 150", lambda: data(browser, "progress", "last") == "150")
        assert int(data(browser, "progress", "points") or 0) > progress_before
        wait_for("the ROC at 150", lambda: data(browser, "roc", "version") == "150")
        assert browser.execute_script("return window.__sameDocument === true;")

        # the verify playground: two samples picked from the picture, the API's own answer
        recent = client.get(f"/v1/models/{name}/recent", params={"limit": 300}).json()
        assert recent["version"] == 150
        labels = [s["y"] for s in recent["samples"]]
        i = 0
        j = next(k for k in range(len(labels)) if labels[k] != labels[0])
        points = recent["projection"]["z"]["points"]
        for k in (i, j):
            click_sample(browser, "picture-z", points[k])
        a = json.loads(browser.find_element(By.ID, "verify-a").get_attribute("value") or "null")
        b = json.loads(browser.find_element(By.ID, "verify-b").get_attribute("value") or "null")
        assert a == recent["samples"][i]["x"] and b == recent["samples"][j]["x"]
        browser.find_element(By.ID, "verify-go").click()
        shown = wait_for(
            "the verify answer",
            lambda: browser.find_element(By.CSS_SELECTOR, "#verify-result dl").get_attribute(
                "data-answer"
            ),
        )
        expected = client.post(f"/v1/models/{name}/verify", json={"a": a, "b": b}).json()
        assert json.loads(shown) == expected
        decision = browser.find_element(By.ID, "verify-same").text
        assert decision == ("same class" if expected["same"] else "different classes")

        # identify by example: the gallery exists, so the form is there and answers as the API
        browser.find_element(By.ID, "identify-x").send_keys(json.dumps(X[0].tolist()))
        browser.find_element(By.CSS_SELECTOR, "#identify button").click()
        first = wait_for(
            "identify matches",
            lambda: browser.find_element(By.CSS_SELECTOR, "#identify-result tbody td").text,
        )
        answer = client.post(f"/v1/models/{name}/identify", json={"x": X[0].tolist(), "k": 5})
        assert first == answer.json()["matches"][0]["id"] == "p0"
        shot(browser, "model")

        # a model holding samples out: its certificate, and the held-out estimate and bound
        # of the served threshold beside the curve
        make_model(client, "held", DIM, holdout=0.3)
        H, z = stream(400, DIM, 3, seed=12)
        feed(client, "held", H[:200], z[:200])
        feed(client, "held", H[200:], z[200:])
        browser.get(svc.url + "/ui/#/models/held")
        wait_for(
            "the certificate", lambda: browser.find_element(By.CSS_SELECTOR, "#certificate table")
        )
        certificate = client.get("/v1/models/held/certificate").json()
        rows = browser.find_elements(By.CSS_SELECTOR, "#certificate tbody tr")
        false_accept = [td.text for td in rows[1].find_elements(By.TAG_NAME, "td")]
        assert false_accept[1:3] == [
            str(certificate["false_accept"]["m"]), str(certificate["false_accept"]["errors"]),
        ]  # fmt: skip
        wait_for("the held-out points", lambda: (data(browser, "roc", "series") or "").endswith(
            ",1,1,1"))  # fmt: skip
        shot(browser, "model-held-out")
    assert_same_origin(browser, svc)
    assert_no_page_errors(browser)


def test_with_keys_the_page_asks_for_one_and_a_query_key_views_but_cannot_delete(
    launch: Launch, own_redis: RedisServer, tmp_path: Path, browser: WebDriver
) -> None:
    entries = [entry_for(key, [scope]) for scope, key in KEYS.items()]
    svc = launch(tmp_path / "svc", own_redis.url, OPML_API_KEYS=json.dumps(entries)).start()
    admin = {"Authorization": f"Bearer {KEYS['admin']}"}
    X, y = stream(60, DIM, 3, seed=3)
    with svc.client() as client:
        assert client.post("/v1/models", json={"name": "kept", "dim": DIM}, headers=admin)
        feed(client, "kept", X, y, **admin)

        browser.get(svc.url + "/ui/")
        field = wait_for("the key form", lambda: browser.find_element(By.ID, "key"))
        shot(browser, "key")
        field.send_keys("not-a-key")
        browser.find_element(By.CSS_SELECTOR, "#key-form button").click()
        wait_for("the key refused", lambda: "not accepted" in browser.find_element(
            By.ID, "key-form").text)  # fmt: skip
        browser.find_element(By.ID, "key").send_keys(KEYS["query"])
        browser.find_element(By.CSS_SELECTOR, "#key-form button").click()
        row = wait_for(
            "the model's row",
            lambda: browser.find_element(By.CSS_SELECTOR, 'tr[data-model="kept"]'),
        )
        assert data(browser, "scopes", "scopes") == "query"
        assert "Key scopes: query" in browser.find_element(By.ID, "keybox").text
        delete = row.find_element(By.CSS_SELECTOR, "button.delete")
        assert not delete.is_enabled()
        assert browser.find_element(By.CSS_SELECTOR, "#create fieldset").get_attribute("disabled")
        stored = browser.execute_script(
            "return [sessionStorage.getItem('opml.console.key'), localStorage.length];"
        )
        assert stored == [KEYS["query"], 0]  # this tab only
        # the API refuses the page's key a delete even if the page tried
        status = browser.execute_async_script(
            "const done = arguments[0];"
            "fetch('/v1/models/kept', {method: 'DELETE', headers: {Authorization: "
            "'Bearer ' + sessionStorage.getItem('opml.console.key')}}).then((r) => done(r.status));"
        )
        assert status == 403
        shot(browser, "models-query-key")

        # the model page works with the key (REST and the /events socket's subprotocol)
        row.find_element(By.LINK_TEXT, "kept").click()
        wait_for("version 60 over /events", lambda: data(browser, "counters", "version") == "60")
        wait_for("the picture", lambda: data(browser, "picture-z", "points") == "60")
        shot(browser, "model-query-key")
        assert client.get("/v1/models/kept", headers=admin).status_code == 200  # still there
    assert_same_origin(browser, svc)
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    # the refused attempts above (401 for the wrong key, 403 for the delete) are the only errors
    assert all(" 401 " in e["message"] or " 403 " in e["message"] for e in severe), severe
