//! A real browser for the console tests: Debian's `chromium`, headless, driven over its DevTools
//! protocol (a WebSocket; `tungstenite`). Clicks and keys are real input events at the element's
//! place on the page, as a person's would be; what the page logs as an error or throws is kept.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};
use tungstenite::{Message, WebSocket};

use super::TempDir;

/// The browser binary (Debian's package installs `/usr/bin/chromium`).
pub fn chromium() -> String {
    std::env::var("VQ_TEST_CHROMIUM").unwrap_or_else(|_| "chromium".to_string())
}

pub struct Browser {
    child: Child,
    ws: WebSocket<TcpStream>,
    session: String,
    next_id: u64,
    /// Errors the page reported: exceptions, `console.error`, failed loads.
    errors: Vec<String>,
    _profile: TempDir,
}

impl Browser {
    /// A headless browser with one page of `width` × `height` CSS pixels.
    pub fn start(width: u32, height: u32) -> Browser {
        let profile = TempDir::new("chromium");
        let mut child = Command::new(chromium())
            .args([
                "--headless=new",
                // The tests run as root in CI, where the sandbox refuses to start.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--remote-debugging-port=0",
                &format!("--window-size={width},{height}"),
                &format!("--user-data-dir={}", profile.0.display()),
                "about:blank",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromium()));
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("DevTools listening on ") {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("chromium did not open its DevTools port within 30 s");
        let host = url
            .strip_prefix("ws://")
            .and_then(|rest| rest.split('/').next())
            .unwrap()
            .to_string();
        let stream = TcpStream::connect(&host).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let (ws, _) = tungstenite::client::client(url.as_str(), stream).unwrap();
        let mut browser = Browser {
            child,
            ws,
            session: String::new(),
            next_id: 0,
            errors: Vec::new(),
            _profile: profile,
        };
        let targets = browser.call_browser("Target.getTargets", json!({}));
        let page = targets["targetInfos"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .expect("no page target")["targetId"]
            .clone();
        let attached = browser.call_browser(
            "Target.attachToTarget",
            json!({ "targetId": page, "flatten": true }),
        );
        browser.session = attached["sessionId"].as_str().unwrap().to_string();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            browser.call(domain, json!({}));
        }
        browser.viewport(width, height, false);
        browser
    }

    fn send(&mut self, method: &str, params: Value, session: bool) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if session {
            message["sessionId"] = self.session.clone().into();
        }
        self.ws
            .send(Message::text(message.to_string()))
            .unwrap_or_else(|e| panic!("{method}: {e}"));
        loop {
            let frame = self
                .ws
                .read()
                .unwrap_or_else(|e| panic!("{method}: no answer: {e}"));
            let Message::Text(text) = frame else { continue };
            let reply: Value = serde_json::from_str(text.as_str()).unwrap();
            if reply["id"] == id {
                if let Some(error) = reply.get("error") {
                    panic!("{method}: {error}");
                }
                return reply["result"].clone();
            }
            self.note_event(&reply);
        }
    }

    fn call_browser(&mut self, method: &str, params: Value) -> Value {
        self.send(method, params, false)
    }

    /// One DevTools command on the page.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.send(method, params, true)
    }

    fn note_event(&mut self, event: &Value) {
        let params = &event["params"];
        match event["method"].as_str() {
            Some("Runtime.exceptionThrown") => self.errors.push(format!(
                "exception: {}",
                params["exceptionDetails"]["exception"]["description"]
                    .as_str()
                    .unwrap_or_else(|| params["exceptionDetails"]["text"].as_str().unwrap_or("?"))
            )),
            Some("Runtime.consoleAPICalled") if params["type"] == "error" => self
                .errors
                .push(format!("console.error: {}", params["args"])),
            Some("Log.entryAdded") if params["entry"]["level"] == "error" => {
                self.errors.push(format!(
                    "log: {} {}",
                    params["entry"]["text"],
                    params["entry"]["url"].as_str().unwrap_or("")
                ))
            }
            _ => {}
        }
    }

    /// What the page reported as errors since the last call.
    pub fn take_errors(&mut self) -> Vec<String> {
        // Events that arrived since the last command.
        self.eval("0");
        std::mem::take(&mut self.errors)
    }

    /// The page's size, as a desktop window or a phone (touch, mobile layout).
    pub fn viewport(&mut self, width: u32, height: u32, mobile: bool) {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile }),
        );
    }

    /// Loads `url` and waits for its scripts to have run.
    pub fn open(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url }));
        self.wait_for(
            "document.readyState === 'complete'",
            Duration::from_secs(15),
        );
    }

    /// The value of a JavaScript expression in the page (promises awaited).
    pub fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        );
        if let Some(details) = result.get("exceptionDetails") {
            panic!("{expression}: {details}");
        }
        result["result"]["value"].clone()
    }

    /// Waits until `expression` is truthy; its value.
    pub fn wait_for(&mut self, expression: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let value = self.eval(expression);
            let truthy = !matches!(&value, Value::Null | Value::Bool(false))
                && value != json!(0)
                && value != json!("");
            if truthy {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "waited {within:?} for {expression}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A left click in the middle of the element `selector` (scrolled into view first).
    pub fn click(&mut self, selector: &str) {
        let at = self.eval(&format!(
            "(() => {{ const e = document.querySelector({selector:?}); if (!e) return null; \
             e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); \
             return [r.left + r.width / 2, r.top + r.height / 2]; }})()"
        ));
        let [x, y] = [at[0].as_f64(), at[1].as_f64()]
            .map(|v| v.unwrap_or_else(|| panic!("nothing to click at {selector}")));
        for kind in ["mouseMoved", "mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({ "type": kind, "x": x, "y": y, "button": "left", "clickCount": 1 }),
            );
        }
    }

    /// Replaces the text of the field `selector` as a person would: a click into it, select
    /// all, type.
    pub fn fill(&mut self, selector: &str, text: &str) {
        self.click(selector);
        self.call(
            "Input.dispatchKeyEvent",
            json!({ "type": "keyDown", "key": "a", "code": "KeyA", "modifiers": 2,
                    "windowsVirtualKeyCode": 65, "commands": ["selectAll"] }),
        );
        self.call(
            "Input.dispatchKeyEvent",
            json!({ "type": "keyUp", "key": "a", "code": "KeyA", "modifiers": 2,
                    "windowsVirtualKeyCode": 65 }),
        );
        self.call("Input.insertText", json!({ "text": text }));
    }

    /// One key pressed and released: `Enter`, `Tab`, `Escape`, or a space (` `).
    pub fn press(&mut self, key: &str) {
        let (code, vk, text) = match key {
            "Enter" => ("Enter", 13, Some("\r")),
            "Tab" => ("Tab", 9, None),
            "Escape" => ("Escape", 27, None),
            " " => ("Space", 32, Some(" ")),
            other => panic!("no key {other}"),
        };
        let mut down = json!({ "type": "keyDown", "key": key, "code": code,
                               "windowsVirtualKeyCode": vk, "nativeVirtualKeyCode": vk });
        if let Some(text) = text {
            down["text"] = text.into();
        }
        self.call("Input.dispatchKeyEvent", down);
        self.call(
            "Input.dispatchKeyEvent",
            json!({ "type": "keyUp", "key": key, "code": code,
                    "windowsVirtualKeyCode": vk, "nativeVirtualKeyCode": vk }),
        );
    }

    /// A PNG of the whole page (beyond the window too).
    pub fn screenshot(&mut self, path: &Path) {
        let shot = self.call(
            "Page.captureScreenshot",
            json!({ "format": "png", "captureBeyondViewport": true }),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
