#![no_main]
// See revault_engine::fuzzing::container for what the input is.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    revault_engine::fuzzing::container(data);
});
