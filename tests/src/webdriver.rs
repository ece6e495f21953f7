//! Just enough of the W3C WebDriver protocol to drive Debian's headless Chromium through
//! `chromedriver`: open a page, find elements, read text, click.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Where the browser and its driver are (Debian's `chromium` and `chromium-driver`).
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// See [`CHROMIUM`].
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A running chromedriver with one headless browser session.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session with JavaScript turned off, so
    /// that a page proves it works without it.
    pub async fn start_without_javascript() -> Result<Browser, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?.local_addr().unwrap().port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {CHROMEDRIVER}: {e}"))?;
        let profile = tempfile::tempdir().map_err(|e| e.to_string())?;
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let mut browser = Browser { driver, base, session: String::new(), http, _profile: profile };
        for _ in 0..100 {
            if browser.http.get(format!("{}/status", browser.base)).send().await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let args = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ];
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        args.push(format!("--user-data-dir={}", browser._profile.path().display()));
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": args,
                "prefs": { "profile.managed_default_content_settings.javascript": 2 },
            },
        }}});
        let created = browser.call("POST", "/session", Some(capabilities)).await?;
        browser.session = created["sessionId"].as_str().ok_or("no session id")?.to_string();
        Ok(browser)
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let url = format!("{}{path}", self.base);
        let request = match method {
            "GET" => self.http.get(url),
            "DELETE" => self.http.delete(url),
            _ => self
                .http
                .post(url)
                .header("content-type", "application/json")
                .body(body.unwrap_or(json!({})).to_string()),
        };
        let text = request.send().await.map_err(|e| e.to_string())?.text().await.map_err(|e| e.to_string())?;
        let reply: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
        if let Some(error) = reply["value"].get("error") {
            return Err(format!("{path}: {error}: {}", reply["value"]["message"]));
        }
        Ok(reply["value"].clone())
    }

    /// Loads `url` and waits for it.
    pub async fn open(&self, url: &str) -> Result<(), String> {
        self.call("POST", &format!("/session/{}/url", self.session), Some(json!({ "url": url }))).await.map(|_| ())
    }

    /// The elements matching a CSS selector.
    pub async fn find_all(&self, css: &str) -> Result<Vec<String>, String> {
        let found = self
            .call(
                "POST",
                &format!("/session/{}/elements", self.session),
                Some(json!({ "using": "css selector", "value": css })),
            )
            .await?;
        Ok(found.as_array().into_iter().flatten().filter_map(|e| e[ELEMENT].as_str().map(str::to_string)).collect())
    }

    /// The one element matching a CSS selector.
    pub async fn find(&self, css: &str) -> Result<String, String> {
        self.find_all(css).await?.into_iter().next().ok_or_else(|| format!("nothing matches {css}"))
    }

    /// The visible text of the element matching `css`.
    pub async fn text(&self, css: &str) -> Result<String, String> {
        let element = self.find(css).await?;
        let text = self.call("GET", &format!("/session/{}/element/{element}/text", self.session), None).await?;
        Ok(text.as_str().unwrap_or_default().to_string())
    }

    /// The text of the element matching `css` once it exists (after a click navigates,
    /// the new page may not be there yet).
    pub async fn wait_text(&self, css: &str) -> Result<String, String> {
        let mut last = String::new();
        for _ in 0..200 {
            match self.text(css).await {
                Ok(text) => return Ok(text),
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(last)
    }

    /// Clicks the element matching `css` (a form button submits its form).
    pub async fn click(&self, css: &str) -> Result<(), String> {
        let element = self.find(css).await?;
        self.call("POST", &format!("/session/{}/element/{element}/click", self.session), Some(json!({})))
            .await
            .map(|_| ())
    }

    /// Types `text` into the input matching `css`.
    pub async fn type_into(&self, css: &str, text: &str) -> Result<(), String> {
        let element = self.find(css).await?;
        self.call("POST", &format!("/session/{}/element/{element}/value", self.session), Some(json!({ "text": text })))
            .await
            .map(|_| ())
    }

    /// The page's source as the browser has it.
    pub async fn source(&self) -> Result<String, String> {
        Ok(self
            .call("GET", &format!("/session/{}/source", self.session), None)
            .await?
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// The URL the browser shows now.
    pub async fn url(&self) -> Result<String, String> {
        Ok(self
            .call("GET", &format!("/session/{}/url", self.session), None)
            .await?
            .as_str()
            .unwrap_or_default()
            .to_string())
    }
}
