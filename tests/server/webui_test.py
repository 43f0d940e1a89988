"""The built-in web pages of `vlm serve`, driven in a real browser: Debian's chromium, headless,
through Debian's chromedriver with Selenium, on loopback only.

- ChatTest (the demo model): examples/shapes.png uploaded with the file picker and "Describe the
  image." asked through the page show the same text and token count the API returns for that
  request, and so does the follow-up turn; the page sends its settings (temperature, max
  tokens) as given in its dialog and keeps them over a reload; Export downloads the
  conversation as shown; images dropped on the page or pasted are attached and sent.
- StopTest (the random-weight fixture, a 4,000-token reply): Stop frees the request on the server
  (running back to 0, counted as cancelled) long before the reply would have ended.
- MarkupTest: a reply forced (structured_outputs.regex) to hold an <img onerror> and a <script> is
  shown as text: no element is created and no script runs.
- ApiKeyTest (--api-key): without the key the page asks for it and a message fails visibly
  (401 shown); after entering it the same message gets its reply.
- DashboardTest: during and after a burst of API requests the dashboard shows non-zero output
  throughput, the request total /metrics reports, and a TTFT p50 equal to the one recomputed here
  from /metrics' buckets with Prometheus' histogram_quantile rule.
Every page load is checked for console errors and for requests to any origin but the server's.
--screenshots DIR saves the chat page and the dashboard as PNGs (docs/img has them).
"""

import argparse
import atexit
import base64
import json
import re
import shutil
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_util as su  # noqa: E402

ARGS = argparse.Namespace()
SHAPES = su.REPO / "examples" / "shapes.png"
WAIT = 60


DOWNLOADS = tempfile.mkdtemp(prefix="vlm-webui-downloads-")
atexit.register(shutil.rmtree, DOWNLOADS, True)


def browser():
    o = Options()
    o.add_experimental_option("prefs", {"download.default_directory": DOWNLOADS,
                                        "download.prompt_for_download": False})
    o.binary_location = "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1280,860", "--no-first-run", "--no-default-browser-check",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-extensions", "--no-proxy-server", "--password-store=basic"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=o)


def post(server, path, body, key=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(server.url(path), data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(req, timeout=su.TIMEOUT) as r:
        return json.load(r)


def png_url(path):
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


def image_turn(url, text="Describe the image.", **part):
    """A user message of one image (its part's extra fields `part`) and a text, as the page
    sends it."""
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}, **part},
                                        {"type": "text", "text": text}]}


def histogram_quantile(q, buckets):
    """Prometheus' bucketQuantile over [(upper bound, cumulative count)], the last bound +Inf."""
    total = buckets[-1][1]
    if total == 0:
        return float("nan")
    rank = q * total
    b = next(i for i, (_, c) in enumerate(buckets) if c >= rank)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start, below = (buckets[b - 1] if b > 0 else (0.0, 0.0))
    return start + (buckets[b][0] - start) * ((rank - below) / (buckets[b][1] - below))


class PageTest(unittest.TestCase):
    """A browser per test class and a server (set by the class); tearDown checks the browser's
    console and every request the pages made."""

    server = None
    allowed_console = ()  # regexes of expected console messages (e.g. a 401 the test provokes)

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.server = cls.start_server(Path(cls.tmp.name))
        cls.driver = browser()

    @classmethod
    def tearDownClass(cls):
        cls.driver.quit()
        cls.server.stop()
        cls.tmp.cleanup()

    def tearDown(self):
        origin = self.server.url("")
        errors = [e["message"] for e in self.driver.get_log("browser") if e["level"] == "SEVERE"
                  and not any(re.search(p, e["message"]) for p in self.allowed_console)]
        self.assertEqual(errors, [], "console errors")
        urls = []
        for entry in self.driver.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            if msg["method"] == "Network.requestWillBeSent":
                urls.append(msg["params"]["request"]["url"])
        self.assertTrue(any(u.startswith(origin) for u in urls), urls)
        foreign = [u for u in urls if not u.startswith((origin + "/", "data:", "blob:"))]
        self.assertEqual(foreign, [], "requests to other hosts")

    def el(self, css):
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def wait(self, predicate, timeout=WAIT, what=""):
        return WebDriverWait(self.driver, timeout, poll_frequency=0.05).until(
            lambda d: predicate(), what)

    def open_chat(self, **settings):
        """Loads the chat page and saves `settings` through its dialog."""
        self.driver.get(self.server.url("/"))
        self.driver.execute_script("localStorage.clear()")
        self.driver.get(self.server.url("/"))
        self.wait(lambda: self.el("#model").text or self.el("#key-dialog").get_attribute("open"),
                  what="the page asked /v1/models")
        if settings:
            self.set_settings(**settings)

    def set_settings(self, **settings):
        """Saves `settings` through the settings dialog."""
        self.el("#open-settings").click()
        for name, value in settings.items():
            field = self.el(f"#settings-form [name={name}]")
            field.clear()
            field.send_keys(str(value))
        self.el("#save-settings").click()
        self.assertFalse(self.el("#settings").get_attribute("open"))

    def ask(self, text, image=None, video=None):
        """Sends a message; returns the element of the reply."""
        before = len(self.driver.find_elements(By.CSS_SELECTOR, ".msg.assistant"))
        if image is not None:
            self.el("#file").send_keys(str(image))
            self.wait(lambda: self.driver.find_elements(By.CSS_SELECTOR, "#attachments img"))
        if video is not None:
            self.el("#file").send_keys(str(video))
            self.wait(lambda: self.driver.find_elements(By.CSS_SELECTOR, "#attachments video"))
        self.el("#prompt").send_keys(text)
        self.el("#send").click()
        self.wait(lambda: len(self.driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")) > before)
        return self.driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]

    def wait_reply(self, reply, timeout=WAIT):
        self.wait(lambda: reply.get_attribute("data-state") != "streaming", timeout, "the reply")
        return reply.get_attribute("data-state")


class ChatTest(PageTest):
    @classmethod
    def start_server(cls, tmp):
        return su.VlmServer(ARGS.vlm, None, tmp, "demo")  # the embedded demo model

    def test_video_matches_api(self):
        """A video attached with the file picker is sent as a video_url part: the reply is the
        API's for the same request."""
        self.open_chat(temperature=0, max_tokens=16)
        clip = su.REPO / "tests/unit/fixtures/videos/mp4_h264_2997.mp4"
        reply = self.ask("What moves?", video=clip)
        self.assertEqual(self.wait_reply(reply), "done")
        shown = self.driver.find_elements(By.CSS_SELECTOR, ".msg.user .thumbs video")
        self.assertEqual(len(shown), 1)
        url = "data:video/mp4;base64," + base64.b64encode(clip.read_bytes()).decode()
        self.assertEqual(shown[0].get_attribute("src"), url)
        api = post(self.server, "/v1/chat/completions", {
            "model": su.MODEL, "temperature": 0, "top_p": 0.95, "max_tokens": 16,
            "messages": [{"role": "user", "content": [
                {"type": "video_url", "video_url": {"url": url}},
                {"type": "text", "text": "What moves?"}]}]})
        want = api["choices"][0]["message"]["content"]
        self.assertTrue(want.strip())
        self.assertEqual(reply.find_element(By.CSS_SELECTOR, ".content").text.strip(), want.strip())
        self.assertEqual(reply.get_attribute("data-tokens"), str(api["usage"]["completion_tokens"]))

    def test_describe_image_matches_api(self):
        self.open_chat(temperature=0, max_tokens=48)
        self.assertEqual(self.el("#model").text, su.MODEL)
        reply = self.ask("Describe the image.", SHAPES)
        self.assertEqual(self.wait_reply(reply), "done")
        # The thumbnail of the image sent is in the conversation.
        thumb = self.driver.find_elements(By.CSS_SELECTOR, ".msg.user .thumbs img")
        self.assertEqual(len(thumb), 1)
        self.assertTrue(thumb[0].get_attribute("src").startswith("data:image/png;base64,"))
        url = png_url(SHAPES)
        api = post(self.server, "/v1/chat/completions", {
            "model": su.MODEL, "temperature": 0, "top_p": 0.95, "max_tokens": 48,
            "messages": [image_turn(url)]})
        want = api["choices"][0]["message"]["content"]
        self.assertTrue(want.strip())
        self.assertEqual(reply.find_element(By.CSS_SELECTOR, ".content").text.strip(), want.strip())
        self.assertEqual(reply.get_attribute("data-tokens"), str(api["usage"]["completion_tokens"]))
        stats = reply.find_element(By.CSS_SELECTOR, ".stats").text
        self.assertRegex(stats, r"\d+ tokens · TTFT \d+ ms")
        # A second turn carries the first: the reply equals the API's for the whole conversation.
        reply2 = self.ask("What color is it?")
        self.assertEqual(self.wait_reply(reply2), "done")
        api2 = post(self.server, "/v1/chat/completions", {
            "model": su.MODEL, "temperature": 0, "top_p": 0.95, "max_tokens": 48,
            "messages": [image_turn(url), {"role": "assistant", "content": want},
                {"role": "user", "content": "What color is it?"}]})
        self.assertEqual(reply2.find_element(By.CSS_SELECTOR, ".content").text.strip(),
                         api2["choices"][0]["message"]["content"].strip())
        # Export: the conversation as JSON, as shown.
        self.el("#export").click()
        exported = self.wait(lambda: [p for p in Path(DOWNLOADS).glob("vlm-chat-*.json")
                                      if p.stat().st_size > 0], what="the exported file")
        data = json.loads(exported[0].read_text())
        self.assertEqual(data["model"], su.MODEL)
        self.assertEqual([(m["role"], m["text"]) for m in data["messages"]], [
            ("user", "Describe the image."), ("assistant", want),
            ("user", "What color is it?"), ("assistant", api2["choices"][0]["message"]["content"])])
        self.assertEqual(data["messages"][0]["images"], [url])
        self.assertEqual(data["messages"][1]["stats"]["tokens"], api["usage"]["completion_tokens"])
        self.assertEqual(data["settings"]["max_tokens"], "48")
        # Settings survive a reload (localStorage).
        self.driver.refresh()
        self.el("#open-settings").click()
        self.assertEqual(self.el("#settings-form [name=max_tokens]").get_attribute("value"), "48")
        self.el("#settings-form button.cancel").click()
        if ARGS.screenshots:
            self.driver.refresh()
            self.wait(lambda: self.el("#model").text)
            self.ask("Describe the image.", SHAPES)
            self.wait(lambda: self.el(".msg.assistant").get_attribute("data-state") == "done")
            self.driver.save_screenshot(str(Path(ARGS.screenshots) / "webui_chat.png"))


    def test_drop_and_paste_attach_images(self):
        """An image dropped on the page and one pasted are both attached and sent."""
        self.open_chat(temperature=0, max_tokens=16)
        b64 = base64.b64encode(SHAPES.read_bytes()).decode()
        for event in ("drop", "paste"):
            self.driver.execute_script("""
                const bytes = Uint8Array.from(atob(arguments[0]), (c) => c.charCodeAt(0));
                const dt = new DataTransfer();
                dt.items.add(new File([bytes], "shapes.png", {type: "image/png"}));
                const e = arguments[1] === "drop"
                  ? new DragEvent("drop", {dataTransfer: dt, bubbles: true, cancelable: true})
                  : new ClipboardEvent("paste", {clipboardData: dt, bubbles: true, cancelable: true});
                document.getElementById(arguments[1] === "drop" ? "messages" : "prompt").dispatchEvent(e);
            """, b64, event)
        self.wait(lambda: len(self.driver.find_elements(By.CSS_SELECTOR, "#attachments img")) == 2)
        reply = self.ask("How many shapes are there?")
        self.assertEqual(self.wait_reply(reply), "done")
        thumbs = self.driver.find_elements(By.CSS_SELECTOR, ".msg.user .thumbs img")
        self.assertEqual([t.get_attribute("src") for t in thumbs],
                         ["data:image/png;base64," + b64] * 2)
        self.assertEqual(self.driver.find_elements(By.CSS_SELECTOR, "#attachments img"), [])


class FixtureServer:
    @classmethod
    def start_server(cls, tmp):
        model = su.make_model_dir(ARGS.model_dir, tmp / "model")
        return su.VlmServer(ARGS.vlm, model, tmp, "fixture", ctx=4096,
                            extra_args=cls.server_args)


class StopTest(FixtureServer, PageTest):
    server_args = ()

    def test_stop_frees_the_request(self):
        self.open_chat(max_tokens=4000, extra='{"ignore_eos": true}')
        samples, _ = su.metrics(self.server)
        cancelled = su.value(samples, "vlm_requests_total", outcome="cancelled")
        reply = self.ask("Write a very long story.")
        self.wait(lambda: su.value(su.metrics(self.server)[0], "vlm_num_requests_running") == 1,
                  what="the request running")
        self.wait(lambda: reply.find_element(By.CSS_SELECTOR, ".content").text, what="text")
        self.el("#stop").click()
        stopped_at = time.monotonic()
        self.assertEqual(self.wait_reply(reply), "stopped")
        self.wait(lambda: su.value(su.metrics(self.server)[0], "vlm_num_requests_running") == 0,
                  timeout=10, what="running back to 0")
        samples, _ = su.metrics(self.server)
        self.assertEqual(su.value(samples, "vlm_requests_total", outcome="cancelled"), cancelled + 1)
        self.assertLess(time.monotonic() - stopped_at, 10)
        self.assertTrue(self.el("#send").is_displayed())
        # The conversation goes on after a Stop (the stopped reply's text is part of it).
        self.set_settings(max_tokens=5)
        reply = self.ask("And then?")
        self.assertEqual(self.wait_reply(reply), "done")
        self.assertEqual(reply.get_attribute("data-tokens"), "5")


class MarkupTest(FixtureServer, PageTest):
    server_args = ()
    PAYLOAD = ('<img src=x onerror="window.pwned=1"> <script>window.pwned=2</script> **bold** '
               '[link](javascript:window.pwned=3)')

    def test_model_html_is_text(self):
        regex = re.escape(self.PAYLOAD)
        self.open_chat(max_tokens=200, extra=json.dumps({"structured_outputs": {"regex": regex}}))
        reply = self.ask("Say something.")
        self.assertEqual(self.wait_reply(reply), "done")
        content = reply.find_element(By.CSS_SELECTOR, ".content")
        self.assertEqual(content.text, self.PAYLOAD.replace("**bold**", "bold"))
        # (markdown-it refuses the javascript: link: it stays text, no <a>.)
        # Markdown is rendered (bold), HTML is not: no element but <p> and <strong>.
        tags = self.driver.execute_script(
            "return [...arguments[0].querySelectorAll('*')].map(e => e.tagName)", content)
        self.assertEqual(sorted(tags), ["P", "STRONG"])
        self.assertEqual(self.driver.find_elements(By.CSS_SELECTOR, "#messages img, script:not([src])"), [])
        time.sleep(0.3)
        self.assertIsNone(self.driver.execute_script("return window.pwned"))


class ApiKeyTest(FixtureServer, PageTest):
    server_args = ("--api-key", "s3cret")
    allowed_console = (r" 401 ",)

    def test_key_is_asked_and_sent(self):
        self.open_chat()
        self.assertTrue(self.el("#key-dialog").get_attribute("open"), "the page asks for the key")
        self.assertIn("API key", self.el("#error").text)
        self.el("#key-form button.cancel").click()
        self.set_settings(max_tokens=8)
        reply = self.ask("Hello?")
        self.assertEqual(self.wait_reply(reply), "error")
        self.assertIn("401", reply.text)
        self.assertIn("401", self.el("#error").text)
        self.assertTrue(self.el("#key-dialog").get_attribute("open"), "asked again after the 401")
        self.el("#api-key").send_keys("s3cret" + Keys.ENTER)  # Enter saves (does not cancel)
        self.wait(lambda: self.el("#model").text == su.MODEL, what="the models after the key")
        reply = self.ask("Hello again?")
        self.assertEqual(self.wait_reply(reply), "done")
        self.assertEqual(reply.get_attribute("data-tokens"), "8")
        self.assertFalse(self.el("#error").is_displayed())


class DashboardTest(PageTest):
    @classmethod
    def start_server(cls, tmp):
        return su.VlmServer(ARGS.vlm, None, tmp, "dash")

    def tile(self, key):
        return self.el(f"#tile-{key}")

    def test_dashboard_matches_metrics(self):
        self.driver.get(self.server.url("/dashboard?refresh_ms=500"))
        self.wait(lambda: self.tile("requests").get_attribute("data-value") == "0")
        body = {"model": su.MODEL, "max_tokens": 32, "temperature": 0.8, "seed": 0,
                "messages": [image_turn(png_url(SHAPES))]}

        def client(i):
            for k in range(3):
                post(self.server, "/v1/chat/completions", {**body, "seed": 10 * i + k})

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        samples, _ = su.metrics(self.server)
        total = sum(v for (name, _), v in samples.items() if name == "vlm_requests_total")
        self.assertEqual(total, 12)
        self.wait(lambda: self.tile("requests").get_attribute("data-value") == "12",
                  what="the request count")
        output = self.driver.execute_script(
            "return Chart.getChart('chart-throughput').data.datasets[0].data.map(p => p.y)")
        self.assertGreater(max(y or 0 for y in output), 0, output)
        # The tile's TTFT p50 is histogram_quantile over /metrics' buckets.
        buckets = sorted((float(dict(labels)["le"]), v) for (name, labels), v in samples.items()
                         if name == "vlm_time_to_first_token_seconds_bucket")
        want = histogram_quantile(0.5, buckets)
        got = float(self.tile("ttft_p50").get_attribute("data-value"))
        self.assertAlmostEqual(got, want, delta=1e-9 * max(1.0, want))
        gen = su.value(samples, "vlm_generation_tokens_total")
        self.assertEqual(float(self.tile("generated").get_attribute("data-value")), gen)
        self.assertEqual(self.tile("gpu").text.splitlines()[-1], "no GPU")
        # The page's histogram_quantile on cases worked by hand from Prometheus' rule: bounds
        # 1, 2, 4 and +Inf holding 10 observations each.
        cases = [(0.25, [1, 2, 4], [10, 20, 30, 40], 1.0), (0.5, [1, 2, 4], [10, 20, 30, 40], 2.0),
                 (0.6, [1, 2, 4], [10, 20, 30, 40], 2.8), (0.9, [1, 2, 4], [10, 20, 30, 40], 4.0),
                 (0.2, [0, 1], [5, 10, 10], 0.0), (0.5, [1, 2], [0, 0, 0], None)]
        got = self.driver.execute_async_script("""
            const done = arguments[arguments.length - 1];
            import("/static/dashboard.js").then((m) => done(arguments[0].map(
              ([q, bounds, buckets]) => m.histogramQuantile(q, bounds, buckets))));
        """, [[q, b, c] for q, b, c, _ in cases])
        self.assertEqual(got, [want for *_, want in cases])
        self.assertEqual(self.el("#model").text, su.MODEL)
        if ARGS.screenshots:  # a minute of steady traffic from four clients, then the picture
            self.driver.get(self.server.url("/dashboard?refresh_ms=1000"))
            stop = time.monotonic() + 60
            photos = [su.REPO / "tests/data/images" / f for f in
                      ("cat_chelsea.png", "coffee_cup.png", "astronaut_eileen_collins.png")]

            def load(i):
                k = 0
                while time.monotonic() < stop:
                    img = photos[(i + k) % len(photos)] if k % 3 == 0 else SHAPES
                    post(self.server, "/v1/chat/completions", {
                        **body, "seed": 100 * i + k, "max_tokens": 16 + 8 * (k % 4),
                        "messages": [image_turn(png_url(img), max_pixels=65536)]})
                    k += 1

            threads = [threading.Thread(target=load, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            time.sleep(3)
            self.driver.set_window_size(1280, 1480)
            time.sleep(1)
            self.driver.save_screenshot(str(Path(ARGS.screenshots) / "webui_dashboard.png"))


class AssetsTest(unittest.TestCase):
    ASSETS = {"/": "web/index.html", "/dashboard": "web/dashboard.html",
              "/static/chat.js": "web/chat.js", "/static/dashboard.js": "web/dashboard.js",
              "/static/style.css": "web/style.css", "/favicon.ico": "web/favicon.svg",
              "/static/vendor/chart.min.js": "/usr/share/javascript/chart.js/chart.min.js",
              "/static/vendor/markdown-it.js": "/usr/share/javascript/markdown-it/markdown-it.js"}

    def test_assets_and_headers(self):
        """Each page and script is the file it was built from (web/, Debian's packages), sent
        with the strict headers."""
        with tempfile.TemporaryDirectory() as tmp:
            s = su.VlmServer(ARGS.vlm, None, tmp, "assets")
            try:
                for path, file in self.ASSETS.items():
                    with urllib.request.urlopen(s.url(path), timeout=su.TIMEOUT) as r:
                        self.assertEqual(r.read(), (su.REPO / file).read_bytes(), path)
                        csp = r.headers["Content-Security-Policy"]
                        self.assertIn("script-src 'self';", csp)
                        self.assertNotIn("unsafe-", csp)
                        self.assertEqual(r.headers["X-Content-Type-Options"], "nosniff")
                        kind = {".html": "text/html", ".js": "text/javascript",
                                ".css": "text/css", ".svg": "image/svg+xml"}[Path(file).suffix]
                        self.assertTrue(r.headers["Content-Type"].startswith(kind), path)
                # No inline script or style in the pages (the policy would block them anyway).
                for page in ("web/index.html", "web/dashboard.html"):
                    html = (su.REPO / page).read_text()
                    self.assertNotRegex(html, r"<script(?![^>]*\bsrc=)[^>]*>", page)
                    self.assertNotRegex(html, r"<style|\sstyle=|\son[a-z]+=", page)
            finally:
                s.stop()

class NoWebUiTest(unittest.TestCase):
    def test_no_webui(self):
        with tempfile.TemporaryDirectory() as tmp:
            s = su.VlmServer(ARGS.vlm, None, tmp, "nowebui", extra_args=("--no-webui",))
            try:
                for path in ("/", "/dashboard", "/dashboard/metrics", "/static/chat.js"):
                    with self.assertRaises(urllib.error.HTTPError) as e:
                        urllib.request.urlopen(s.url(path), timeout=su.TIMEOUT)
                    self.assertEqual(e.exception.code, 404, path)
            finally:
                s.stop()


if __name__ == "__main__":
    su.run_tests(ARGS, __doc__, lambda ap: ap.add_argument(
        "--screenshots", help="save screenshots of the chat page and the dashboard here"))
