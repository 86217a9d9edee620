# Reference solution of notebook 08's exercise: the scheduler hinge of coordinated denoising (Eqs. 8-11).
x0_s, eps_s = spatial.predict(x_ex, t_ex)                  # Eq. 8: the spatial expert's clean-sample estimate
x_tt = temporal.schedule.add_noise(x0_s, eps_s, t_ex)      # Eq. 9: re-noised on the TEMPORAL schedule
x0_t, eps_t = temporal.predict(x_tt, t_ex)                 # Eq. 10
answer = spatial.schedule.add_noise(x0_t, eps_t, t_ex)     # Eq. 11: back on the spatial schedule
