# expect: re-noised on the spatial schedule   (the check's message must say this: it recognised the mistake)
# A plausible wrong attempt: the hinge is skipped at Eq. 9 -- x0_S is re-noised on the spatial schedule, so the
# temporal expert sees a sample whose noise level is not the one its timestep means (naive alternation's error).
x0_s, eps_s = spatial.predict(x_ex, t_ex)
x_tt = spatial.schedule.add_noise(x0_s, eps_s, t_ex)
x0_t, eps_t = temporal.predict(x_tt, t_ex)
answer = spatial.schedule.add_noise(x0_t, eps_t, t_ex)
