// The SDK's version (package.json's; test/version.test.mjs checks they agree).
export const SDK_VERSION = '0.1.0';
