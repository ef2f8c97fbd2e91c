//! How a setting's text becomes its value ([`SettingValue`]), for the plain types. Its own
//! module because the types that own a setting's meaning implement it where they are defined
//! (`Consent` in consent.rs, `EncryptionKeys` in crypto.rs, `Compression` and `Durability` in
//! config.rs): with the trait in config.rs, config and those modules imported each other.

use std::path::PathBuf;

use crate::error::ConfigError;

/// How a setting's text (CLI `--set`, environment, [`crate::Config::set`]) becomes its value; the error
/// names the setting.
pub trait SettingValue: Sized {
    fn parse(name: &str, value: &str) -> Result<Self, ConfigError>;
}

impl SettingValue for String {
    fn parse(_: &str, value: &str) -> Result<Self, ConfigError> {
        Ok(value.to_string())
    }
}

/// Empty text means "none".
impl SettingValue for Option<String> {
    fn parse(_: &str, value: &str) -> Result<Self, ConfigError> {
        Ok(non_empty(value))
    }
}

impl SettingValue for Option<PathBuf> {
    fn parse(_: &str, value: &str) -> Result<Self, ConfigError> {
        Ok(non_empty(value).map(PathBuf::from))
    }
}

impl SettingValue for u64 {
    fn parse(name: &str, value: &str) -> Result<Self, ConfigError> {
        parse_u64(name, value)
    }
}

impl SettingValue for u32 {
    fn parse(name: &str, value: &str) -> Result<Self, ConfigError> {
        u32::try_from(parse_u64(name, value)?)
            .map_err(|_| ConfigError::new(name, format!("{value} is too large")))
    }
}

impl SettingValue for bool {
    fn parse(name: &str, value: &str) -> Result<Self, ConfigError> {
        match value {
            "true" | "1" | "yes" => Ok(true),
            "false" | "0" | "no" => Ok(false),
            _ => Err(ConfigError::new(
                name,
                format!("'{value}' is not true or false"),
            )),
        }
    }
}

fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_string())
}

fn parse_u64(name: &str, value: &str) -> Result<u64, ConfigError> {
    value
        .trim()
        .replace('_', "")
        .parse::<u64>()
        .map_err(|_| ConfigError::new(name, format!("'{value}' is not a whole number")))
}
