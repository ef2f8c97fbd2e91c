//! Generates the Kotlin, Swift and Python bindings from the built library (see
//! `bindings/generate.sh`). Behind the `bindgen` feature so ordinary builds skip its
//! dependencies.

fn main() {
    uniffi::uniffi_bindgen_main()
}
