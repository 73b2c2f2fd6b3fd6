// What a driver's exported object gets for the calls it need not make its
// own, as the Rust SDK's `Driver` trait has default methods, and the values
// of a batch call's answer.
//
// componentize-js binds the world's export to the object a driver module
// exports as `driver`, and needs every function of the contract on it.
// Spread `defaults` first and the optional ones are answered:
//
//   export const driver = {
//     ...defaults,
//     describe() { … }, // configure, create, get, list, delete, setTags
//   };
//
// A function the driver defines after the spread wins over the default.

import { error, isDriverError } from './errors.js';

/** A batch answer's success: `{tag: 'ok', val}` (`val` undefined for `delete-many`). */
export function ok(val) {
  return { tag: 'ok', val };
}

/**
 * A batch answer's failure, `{tag: 'err', val}`, from a `DriverError` (one
 * of the SDK's `error.*`) or a contract `error` value.
 */
export function err(e) {
  return { tag: 'err', val: isDriverError(e) ? e.payload : e };
}

/** One `permanent` failure per item of `items`: a batch the driver does not make. */
export function notSupported(items, message) {
  return items.map(() => err(error.permanent(message)));
}

/** The contract's optional calls, answered as not supported. */
export const defaults = Object.freeze({
  /**
   * Creates each of `specs` in as few calls to the cloud as it allows: one
   * `ok(instance)` or `err(e)` per spec, in order. Only called when
   * `describe` declares `createMany`; this default says it is not
   * supported, for each spec.
   */
  createMany(specs) {
    return notSupported(specs, 'create-many is not supported by this driver');
  },

  /**
   * Deletes each of `instanceIds` in as few calls to the cloud as it allows,
   * with one check for the batch that they carry the pool's tag: one
   * `ok()` or `err(e)` per id, in order. Only called when `describe`
   * declares `deleteMany`; this default says it is not supported, for each
   * id.
   */
  deleteMany(instanceIds) {
    return notSupported(instanceIds, 'delete-many is not supported by this driver');
  },

  /**
   * The account's quota and usage. Only called when `describe` declares
   * `accountLimits`; this default says it is not supported.
   */
  limits() {
    throw error.permanent('account limits are not supported by this driver');
  },
});
