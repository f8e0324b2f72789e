#![no_main]
// See revault_remote::fuzzing::sealed for what the input is.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    revault_remote::fuzzing::sealed(data);
});
