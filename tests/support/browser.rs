//! Headless Chromium, driven through chromedriver (WebDriver) with
//! fantoccini: the page as a person's browser shows it. chromedriver listens
//! on a port of its choosing on 127.0.0.1 and is killed when dropped.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
    /// `target/ui-screenshots/TEST`.
    shots: PathBuf,
}

/// Chromium's and chromedriver's paths, if both are installed.
fn installed() -> Option<(&'static str, &'static str)> {
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())?;
    let driver = ["/usr/bin/chromedriver"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())?;
    Some((chromium, driver))
}

/// The browser's console log since it was last read
/// (`POST /session/{id}/se/log`, chromedriver's).
#[derive(Debug)]
struct ConsoleLog;

impl WebDriverCompatibleCommand for ConsoleLog {
    fn endpoint(
        &self,
        base: &url::Url,
        session: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/se/log", session.unwrap_or_default()))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (
            http::Method::POST,
            Some(json!({"type": "browser"}).to_string()),
        )
    }
}

impl Browser {
    /// A new browser for `test`, or `None` (said on stderr) where Chromium
    /// or chromedriver is not installed (`scripts/setup tests` installs
    /// them).
    pub async fn start(test: &str) -> Option<Browser> {
        let Some((chromium, chromedriver)) = installed() else {
            eprintln!("skipped: Chromium and chromedriver are not installed here");
            return None;
        };
        let mut driver = Command::new(chromedriver)
            .args(["--port=0", "--allowed-ips=127.0.0.1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromedriver");
        let mut lines = BufReader::new(driver.stdout.take().expect("stdout")).lines();
        let port = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(rest) = line.split("started successfully on port ").nth(1) {
                    return rest.trim_end_matches('.').trim().parse::<u16>().ok();
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .expect("chromedriver says its port");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let profile = tempfile::tempdir().unwrap();
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless=new",
                    // Root, in a container: Chromium's own sandbox cannot start.
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--window-size=1500,1100",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        caps.insert("goog:loggingPrefs".into(), json!({"browser": "ALL"}));
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a WebDriver session");
        let shots = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/ui-screenshots")
            .join(test);
        std::fs::create_dir_all(&shots).unwrap();
        Some(Browser {
            client,
            driver,
            _profile: profile,
            shots,
        })
    }

    /// Saves what the page shows as `NAME.png`, for a person to look at.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.expect("a screenshot");
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }

    /// The console's entries since the last call: (level, message).
    pub async fn console(&self) -> Vec<(String, String)> {
        let log = self
            .client
            .issue_cmd(ConsoleLog)
            .await
            .expect("the console log");
        (log.as_array().cloned().unwrap_or_default().iter())
            .map(|e| {
                (
                    e["level"].as_str().unwrap_or_default().to_owned(),
                    e["message"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    /// The console's errors since the last call.
    pub async fn console_errors(&self) -> Vec<String> {
        (self.console().await.into_iter())
            .filter(|(level, _)| level == "SEVERE")
            .map(|(_, m)| m)
            .collect()
    }

    /// Runs `script` in the page; its value.
    pub async fn eval(&self, script: &str) -> Value {
        self.client
            .execute(script, vec![])
            .await
            .unwrap_or_else(|e| panic!("{script}: {e}"))
    }

    /// Waits (at most `secs`) until `script` is truthy in the page; its value.
    pub async fn until(&self, secs: u64, what: &str, script: &str) -> Value {
        let end = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.eval(script).await;
            if !(v.is_null() || v == false || v == "" || v == 0) {
                return v;
            }
            if tokio::time::Instant::now() > end {
                let shot = self.screenshot(&format!("timeout-{}", slug(what))).await;
                panic!(
                    "the page did not show {what} within {secs} s (screenshot {})",
                    shot.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Clicks the element `css` finds.
    pub async fn click(&self, css: &str) {
        let e = self
            .client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"));
        e.click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// Types `text` into the element `css` finds.
    pub async fn type_into(&self, css: &str, text: &str) {
        let e = self
            .client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"));
        e.send_keys(text)
            .await
            .unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill().await;
    }
}

fn slug(what: &str) -> String {
    what.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}
