// The loss scaler's update, shared by two programs: mixed.cu's amp_update (the main kernels) and
// conditional.cu's graphed_amp_update_set (the condition kernels, compiled apart), so both update
// the scale with the same arithmetic. The state is [scale, found_inf, good_steps,
// skipped_steps]: on overflow back off and count a skipped step, else grow the scale every
// `interval` good steps. Plain C types: the condition program has none of the main one's.
__device__ __forceinline__ void amp_update_state(float* scaler, float growth, float backoff, unsigned int interval) {
    if (scaler[1] != 0.0f) {
        scaler[0] = scaler[0] * backoff;
        scaler[2] = 0.0f;
        scaler[3] = scaler[3] + 1.0f;
    } else {
        const float good = scaler[2] + 1.0f;
        if (good >= (float)interval) {
            scaler[0] = scaler[0] * growth;
            scaler[2] = 0.0f;
        } else {
            scaler[2] = good;
        }
    }
}
