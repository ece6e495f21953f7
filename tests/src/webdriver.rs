//! Debian's headless Chromium driven through `chromedriver` with `fantoccini`: open a page,
//! find elements, read text, type, click, take a screenshot.

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

/// Where the browser and its driver are (Debian's `chromium` and `chromium-driver`).
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// See [`CHROMIUM`].
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A running chromedriver with one headless browser session.
pub struct Browser {
    driver: Child,
    client: Client,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    /// Ends chromedriver and everything it started (Chromium and its helpers, which a kill
    /// of chromedriver alone leaves running): they share its process group.
    fn drop(&mut self) {
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session with JavaScript turned off, so
    /// that a page proves it works without it.
    pub async fn start_without_javascript() -> Result<Browser, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0").map_err(text)?.local_addr().map_err(text)?.port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting {CHROMEDRIVER}: {e}"))?;
        let profile = tempfile::tempdir().map_err(text)?;
        let mut args: Vec<String> = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.push(format!("--user-data-dir={}", profile.path().display()));
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("browserName".into(), json!("chrome"));
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": args,
                "prefs": { "profile.managed_default_content_settings.javascript": 2 },
            }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let mut last = String::new();
        // chromedriver takes a moment to listen.
        for _ in 0..100 {
            // chromedriver speaks plain HTTP on loopback: no TLS connector needed.
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector).capabilities(capabilities.clone()).connect(&url).await {
                Ok(client) => return Ok(Browser { driver, client, _profile: profile }),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!("no WebDriver session: {last}"))
    }

    /// Loads `url` and waits for it.
    pub async fn open(&self, url: &str) -> Result<(), String> {
        self.client.goto(url).await.map_err(text)
    }

    /// The elements matching a CSS selector.
    pub async fn find_all(&self, css: &str) -> Result<Vec<Element>, String> {
        self.client.find_all(Locator::Css(css)).await.map_err(text)
    }

    /// The one element matching a CSS selector.
    pub async fn find(&self, css: &str) -> Result<Element, String> {
        self.client.find(Locator::Css(css)).await.map_err(|e| format!("nothing matches {css}: {e}"))
    }

    /// The visible text of the element matching `css`.
    pub async fn text(&self, css: &str) -> Result<String, String> {
        self.find(css).await?.text().await.map_err(text)
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

    /// The text of the element matching `css` once it contains `needle` (a click's
    /// navigation may land later than the click returns), or the last text seen after ten
    /// seconds, for the caller's assertion to show.
    pub async fn wait_text_containing(&self, css: &str, needle: &str) -> Result<String, String> {
        let mut last = Err(format!("no {css}"));
        for _ in 0..200 {
            last = self.text(css).await;
            if last.as_ref().is_ok_and(|t| t.contains(needle)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        last
    }

    /// Clicks the element matching `css` (a form button submits its form).
    pub async fn click(&self, css: &str) -> Result<(), String> {
        self.find(css).await?.click().await.map_err(text)
    }

    /// Types `keys` into the input matching `css`.
    pub async fn type_into(&self, css: &str, keys: &str) -> Result<(), String> {
        self.find(css).await?.send_keys(keys).await.map_err(text)
    }

    /// The page's source as the browser has it.
    pub async fn source(&self) -> Result<String, String> {
        self.client.source().await.map_err(text)
    }

    /// A PNG of the whole page as the browser shows it now (the window widened and
    /// lengthened to fit it), written to `path`, its folder made.
    pub async fn screenshot(&self, path: &std::path::Path) -> Result<(), String> {
        self.client.set_window_size(1400, 1800).await.map_err(text)?;
        let png = self.client.screenshot().await.map_err(text)?;
        if let Some(folder) = path.parent() {
            std::fs::create_dir_all(folder).map_err(text)?;
        }
        std::fs::write(path, png).map_err(|e| format!("writing {}: {e}", path.display()))
    }

    /// The URL the browser shows now.
    pub async fn url(&self) -> Result<String, String> {
        self.client.current_url().await.map(|u| u.to_string()).map_err(text)
    }
}
